"""The opt-in EndpointSlice controller (`netclaim-publisher endpoints`): Services on secondary networks."""
