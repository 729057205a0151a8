"""Which runtime tears a sandbox down with which config, read from the kubelet's container IDs."""

from __future__ import annotations

from publisher.keeper.runtime import CACHED_CONFIG, LOADED_CONFIG, RuntimeTeardown, teardown_in, teardown_of


def test_containerd_tears_down_with_its_loaded_config_and_cri_o_with_the_cached_one() -> None:
    assert teardown_of("containerd://4f2a") == LOADED_CONFIG
    assert teardown_of("cri-o://4f2a") == CACHED_CONFIG
    assert teardown_of("docker://4f2a") == "" and teardown_of("4f2a") == ""


def test_the_first_started_container_of_the_nodes_pods_names_the_runtime() -> None:
    pods = [{"status": {"containerStatuses": [{"name": "app"}]}},  # not started yet: no ID
            {"status": {"initContainerStatuses": [{"containerID": "containerd://aa"}]}}]
    assert teardown_in(pods) == LOADED_CONFIG
    assert teardown_in([{"status": {}}]) == ""


class PodListStandIn:
    """A stand-in for the API's pod list, to drive the learning loop; the real one runs in test_node_life.py."""

    def __init__(self, pages: list[object]) -> None:
        self.pages = pages

    def list_pods_on_node(self, node: str, limit: int = 200) -> dict:
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return {"items": page}


def test_until_the_runtime_is_known_cached_configs_count(monkeypatch) -> None:
    import publisher.keeper.runtime as runtime

    monkeypatch.setattr(runtime, "RETRY", 0.01)
    api = PodListStandIn([OSError("refused"), [], [{"status": {"containerStatuses": [{"containerID": "containerd://b"}]}}]])
    teardown = RuntimeTeardown("auto", api, "node-a")
    assert teardown.uses_cached_config()
    teardown._learn()  # the background thread's body, run here to its end
    assert (teardown.known, teardown.uses_cached_config()) == (True, False)
    assert RuntimeTeardown("loaded-config").uses_cached_config() is False
    assert RuntimeTeardown("auto").uses_cached_config() is True  # no API: never learnt, stays cautious
