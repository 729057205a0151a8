"""The lean API client: transport and credentials, typed calls with their rate limit, and list-watch loops that
back off like client-go."""
