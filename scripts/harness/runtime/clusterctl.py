"""The Python steps of scripts/cluster.sh, one subcommand each.

    clusterctl.py pause-image DIR
        build the local sandbox image archive in DIR; prints its path
    clusterctl.py publisher-kubeconfig --admin K --server URL --ca FILE --node N --driver D --out FILE
        apply the shipped namespace + RBAC, mint a Node-bound ServiceAccount token, write FILE (0600)
    clusterctl.py dranet-kubeconfig --admin K --server URL --ca FILE --node N --rbac FILE --out FILE
        apply dranet's namespace, ServiceAccount and RBAC (FILE), mint a Node-bound token for it, write the kubeconfig
    clusterctl.py publisher-ready --socket PATH [--timeout S]
        wait until the publisher answers a status request on its socket

The shell script owns process lifetimes; these are the parts that need the
project's Python code (the pause image builder, the identity helpers, the
wire format), so they are not written twice.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[2]))

from runtime import pause_image  # noqa: E402
from runtime.identity import publisher_kubeconfig  # noqa: E402


def cmd_pause_image(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    print(pause_image.build(out))
    return 0


def cmd_publisher_kubeconfig(args: argparse.Namespace) -> int:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=args.admin, client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        print(publisher_kubeconfig(api, server=args.server, ca_file=args.ca, node=args.node, driver=args.driver,
                                   path=args.out, seconds=args.seconds))
    return 0


def cmd_dranet_kubeconfig(args: argparse.Namespace) -> int:
    """dranet's identity: the RBAC file's ServiceAccount with a token bound to the Node (associated-node verbs)."""
    import yaml
    from kubernetes import client, config

    from runtime.identity import apply_documents, ensure_node, node_token, write_kubeconfig

    docs = [d for d in yaml.safe_load_all(Path(args.rbac).read_text()) if d]
    (account,) = [d["metadata"] for d in docs if d["kind"] == "ServiceAccount"]
    configuration = client.Configuration()
    config.load_kube_config(config_file=args.admin, client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        apply_documents(api, docs)
        token = node_token(api, ensure_node(api, args.node), args.seconds,
                           namespace=account["namespace"], service_account=account["name"])
    print(write_kubeconfig(args.out, args.server, args.ca, token, user=f"{account['namespace']}:{account['name']}"))
    return 0


def _status(path: str) -> dict:
    from cni_plugin.wire.frame import encode_frame, read_frame

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(encode_frame({"kind": "status"}))
        return read_frame(s)


def cmd_publisher_ready(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            _status(args.socket)
            return 0
        except OSError as exc:
            if time.monotonic() > deadline:
                print(f"publisher socket {args.socket} not answering: {exc}", file=sys.stderr)
                return 1
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pause-image")
    p.add_argument("dir")
    p.set_defaults(func=cmd_pause_image)
    p = sub.add_parser("publisher-kubeconfig")
    for flag in ("--admin", "--server", "--ca", "--node", "--driver", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--seconds", type=int, default=86400)
    p.set_defaults(func=cmd_publisher_kubeconfig)
    p = sub.add_parser("dranet-kubeconfig")
    for flag in ("--admin", "--server", "--ca", "--node", "--rbac", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--seconds", type=int, default=86400)
    p.set_defaults(func=cmd_dranet_kubeconfig)
    p = sub.add_parser("publisher-ready")
    p.add_argument("--socket", required=True)
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_publisher_ready)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
