"""The long-lived parts of the model test: one namespace, the TCP proxy in front of the
real API server, the publisher's rotating credentials, one publisher process whose
journal dir is kept across SIGKILLs, and the real plugin. Built once per module;
sequences clean their own claims, pods and netns."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from modelkit import Credentials, PluginRunner, Proxy, PublisherProc  # noqa: E402
from scenario import Harness  # noqa: E402


@pytest.fixture(scope="module")
def harness(control_plane, api_client):
    if os.geteuid() != 0:
        pytest.fail("the model test needs root: it creates network namespaces", pytrace=False)
    workdir = Path(tempfile.mkdtemp(prefix="nc-model-"))
    os.chmod(workdir, 0o700)
    (workdir / "a-file").write_text("a regular file: a spool dir under it cannot be created\n")
    url = urlparse(control_plane.server)
    proxy = Proxy((url.hostname or "127.0.0.1", url.port or 443)).start()
    creds = Credentials(api_client, workdir, f"https://127.0.0.1:{proxy.port}", control_plane.ca_file).setup()
    publisher = PublisherProc(workdir / "publisher", creds.kubeconfig)
    publisher.workdir.mkdir(mode=0o700)
    namespace = f"model-{uuid.uuid4().hex[:6]}"
    from kubernetes import client

    client.CoreV1Api(api_client).create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    publisher.start()
    h = Harness(api_client, control_plane, workdir, namespace, proxy, creds, publisher,
                PluginRunner(workdir, publisher))
    yield h
    publisher.stop()
    proxy.cut()
    if not h.apiserver_up:
        control_plane.start_apiserver()
    creds.cleanup()
    try:
        client.CoreV1Api(api_client).delete_namespace(namespace)
    except Exception:  # noqa: BLE001 - cleanup only
        pass
    if not os.environ.get("NETCLAIM_MODEL_KEEP"):
        shutil.rmtree(workdir, ignore_errors=True)
