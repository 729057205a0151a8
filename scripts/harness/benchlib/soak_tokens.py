"""The soak's credential rotation: the node agents' tokens replaced the way kubelet rotates a projected token,
each old one revoked at once; and the rule that judges whether the publisher and the keeper worked on.

At set-up (`Tokens.setup`) the publisher's and the chain keeper's kubeconfigs are switched to a `tokenFile`
user of the ServiceAccount the operator-way install made (netclaim-publisher, with exactly the shipped
grants; nothing is granted here):
- the publisher's token stays node-scoped, as the Node-bound token it had: it is bound to a holder pod on
  the node (a pause pod with no token of its own), so it carries the node's name as kubelet's pod-bound
  tokens do and the `associated-node:` verbs keep working; deleting the holder revokes it;
- the keeper's token is bound to a Secret (the keeper needs no node scope); deleting the Secret revokes it.
  The keeper is started with that kubeconfig, its node's name (ChainContested Events) and a stand-in of the
  chart's DaemonSet to watch (one that places no pod), the shipped Role's one DaemonSet: its owner watch is
  the keeper's long-lived use of the API, and it lists again after every API server restart.

`Tokens.rotate` (the `token-rotation` fault) mints generation n+1 for both, replaces both files atomically
(write to a temporary file, rename), deletes generation n's holder pod and Secret, and returns once a
TokenReview refuses both old tokens. Neither process is restarted: they re-read the file every 60 s and
at once after a 401.

`rotation_verdict` judges each rotation from what the soak saw: the publisher's metrics (credential
reloads, consecutive 401s), the claimed pods started after the rotation (their claims must show them),
and the keeper's log (credentials reloaded; owner watch refused).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runtime import identity
from runtime.controlplane import api_client
from runtime.realcluster import PAUSE_IMAGE, RealCluster

NAMESPACE, ACCOUNT = identity.NAMESPACE, identity.SERVICE_ACCOUNT
STAND_IN = "netclaim"  # the chart's DaemonSet name, the one the shipped keeper Role names
RELOAD = 60.0  # the agents' re-read interval (publisher/limits.py CREDENTIALS_RELOAD)
REFUSED_FOR = RELOAD + 10.0  # a 401 lasting longer than this is a violation


@dataclass
class Generation:
    number: int
    holder: dict[str, str]  # the publisher's token is bound to this pod
    secret: dict[str, str]  # the keeper's to this Secret
    publisher_token: str = field(repr=False)
    keeper_token: str = field(repr=False)


@dataclass
class Rotation:
    """One rotation as the fault did it: when the files were replaced, when the old tokens were refused."""

    generation: int
    written: float
    refused: float = 0.0
    publisher_pid: int | None = None
    claimed_restart: str = ""


def replace_file(path: Path, text: str) -> None:
    """Write by atomic replace, as kubelet's atomic writer swaps a projected token: a reader sees old or new."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


class Tokens:
    """The node agents' rotating tokens (see the module docstring)."""

    def __init__(self, cluster: RealCluster, nc: Path) -> None:
        from kubernetes import client

        self.cluster = cluster
        self.api = api_client(cluster.kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.dir = nc / "tokens"
        self.publisher_kubeconfig = nc / "publisher.kubeconfig"  # the path cluster.sh starts the publisher with
        self.keeper_kubeconfig = self.dir / "keeper.kubeconfig"
        self.publisher_token = self.dir / "publisher.token"
        self.keeper_token = self.dir / "keeper.token"
        self.generations: list[Generation] = []
        self.rotations: list[Rotation] = []
        self.write_new_token = True  # False only to see the verdict fail: the old credential revoked, no new one

    # ------------------------------------------------------------ set-up

    def setup(self) -> dict[str, str]:
        """Generation 1 on disk, both kubeconfigs read their token files; the keeper's environment."""
        self.dir.mkdir(mode=0o700, exist_ok=True)
        cfg = yaml.safe_load(self.publisher_kubeconfig.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        server, ca = cluster["server"], cluster["certificate-authority"]
        self.stand_in()
        self.publish(self.mint())
        for path, token, user in ((self.publisher_kubeconfig, self.publisher_token, "publisher"),
                                  (self.keeper_kubeconfig, self.keeper_token, "chain-keeper")):
            replace_file(path, yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": ca}}],
                "users": [{"name": f"{NAMESPACE}:{ACCOUNT}:{user}", "user": {"tokenFile": str(token)}}],
                "contexts": [{"name": "local", "context": {"cluster": "local", "user": f"{NAMESPACE}:{ACCOUNT}:{user}"}}],
                "current-context": "local"}, sort_keys=False))
        return {"NETCLAIM_KUBECONFIG": str(self.keeper_kubeconfig), "NETCLAIM_NODE_NAME": self.cluster.node,
                "NETCLAIM_DAEMONSET": STAND_IN, "NETCLAIM_NAMESPACE": NAMESPACE}

    def stand_in(self) -> None:
        """The chart's DaemonSet as an object only: its node selector matches no node, so it places no pod."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        labels = {"app.kubernetes.io/name": "netclaim-soak-stand-in"}
        body = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": STAND_IN, "namespace": NAMESPACE},
                "spec": {"selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels}, "spec": {
                             "nodeSelector": {"netclaim.dev/soak-stand-in": "no-node-has-this"},
                             "containers": [{"name": "stand-in", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}]}}}}
        try:
            client.AppsV1Api(self.api).create_namespaced_daemon_set(NAMESPACE, body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    # ------------------------------------------------------------ generations

    def mint(self) -> Generation:
        number = len(self.generations) + 1
        name = f"soak-token-{number}"
        holder = identity.token_holder(self.api, NAMESPACE, name, ACCOUNT, self.cluster.node, PAUSE_IMAGE,
                                       labels={"soak": "token-holder"})
        secret = self.core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": name}, "type": "Opaque"})
        bound = {"name": secret.metadata.name, "uid": secret.metadata.uid}
        gen = Generation(number, holder, bound,
                         identity.bound_token(self.api, "Pod", holder, namespace=NAMESPACE, service_account=ACCOUNT),
                         identity.bound_token(self.api, "Secret", bound, namespace=NAMESPACE, service_account=ACCOUNT))
        claims = identity.jwt_claims(gen.publisher_token).get("kubernetes.io") or {}
        if (claims.get("node") or {}).get("name") != self.cluster.node:
            raise RuntimeError(f"the publisher's token does not carry the node's name: {claims}")
        self.generations.append(gen)
        return gen

    def publish(self, gen: Generation) -> None:
        replace_file(self.publisher_token, gen.publisher_token)
        replace_file(self.keeper_token, gen.keeper_token)

    def revoke(self, gen: Generation) -> None:
        self.core.delete_namespaced_pod(gen.holder["name"], NAMESPACE, grace_period_seconds=0)
        self.core.delete_namespaced_secret(gen.secret["name"], NAMESPACE)

    def rotate(self, publisher_pid: int | None, timeout: float = 90.0) -> tuple[Rotation, list[str]]:
        """Generation n+1 on disk, generation n revoked; returns once a TokenReview refuses both old tokens."""
        old = self.generations[-1]
        new = self.mint()
        rotation = Rotation(new.number, time.time(), publisher_pid=publisher_pid)
        if self.write_new_token:
            self.publish(new)
        self.rotations.append(rotation)
        self.revoke(old)
        deadline = time.monotonic() + timeout
        while (identity.authenticated(self.api, old.publisher_token) or identity.authenticated(self.api, old.keeper_token)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"token generation {old.number} still accepted {timeout:.0f}s after its revocation")
            time.sleep(0.5)
        rotation.refused = time.time()
        if not (identity.authenticated(self.api, new.publisher_token) and identity.authenticated(self.api, new.keeper_token)):
            raise RuntimeError(f"token generation {new.number} is not accepted")
        live = new.number if self.write_new_token else old.number
        notes = [f"token generation {live} live on disk (publisher: bound to pod {new.holder['name']}, "
                 f"keeper: bound to secret {new.secret['name']})" if self.write_new_token else
                 f"NEGATIVE CHECK: generation {new.number} minted but not written; generation {old.number} stays on disk",
                 f"generation {old.number} revoked (holder pod and secret deleted), refused by TokenReview after "
                 f"{rotation.refused - rotation.written:.1f}s"]
        return rotation, notes


# ---------------------------------------------------------------- what the agents showed


@dataclass
class CredScrape:
    """The publisher's credential figures at one scrape."""

    t: float
    pid: int
    reloads: float
    unauthorized: float  # consecutive 401s


@dataclass
class KeeperLine:
    t: float
    kind: str  # "reloaded" or "refused"
    text: str


def keeper_lines(path: Path) -> list[KeeperLine]:
    """The keeper's credential reloads and its API refusals (401) from its JSON log."""
    out: list[KeeperLine] = []
    try:
        raw = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in raw:
        try:
            rec = json.loads(line)
            t = dt.datetime.strptime(rec["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        text = json.dumps(rec)[:300]
        if rec.get("msg") == "credentials reloaded":
            out.append(KeeperLine(t, "reloaded", text))
        elif "401" in text or "Unauthorized" in text or "unauthorized" in text:
            out.append(KeeperLine(t, "refused", text))
    return out


def refused_spans(times: list[float], end: float, gap: float = REFUSED_FOR) -> list[tuple[float, float]]:
    """Stretches of refusals: consecutive refusals less than `gap` apart; a stretch still going at `end`
    (its last refusal less than `gap` before it) lasts until `end`."""
    spans: list[tuple[float, float]] = []
    for t in sorted(times):
        if spans and t - spans[-1][1] < gap:
            spans[-1] = (spans[-1][0], t)
        else:
            spans.append((t, t))
    if spans and end - spans[-1][1] < gap:
        spans[-1] = (spans[-1][0], max(spans[-1][1], end))
    return spans


def rotation_verdict(rotations: list[Rotation], scrapes: list[CredScrape], shown: dict[str, tuple[float, float]],
                     keeper: list[KeeperLine], apiserver_restarts: list[float], end: float,
                     t0: float = 0.0) -> dict[str, Any]:
    """Did the publisher and the keeper work on with each new token?

    For rotation n (files replaced at `written`), up to the next rotation (or the end):
    - a claimed pod whose sandbox was created after the rotation is shown by its claim (`shown`: sandbox id ->
      (created, first shown)), i.e. the publisher resolved and applied with the new token;
    - the publisher process that ran at the rotation, if it still ran after that claim was shown, counted a
      credential reload (netclaim_credential_reloads_total) after the rotation;
    - after an API server restart (every watch lists again), the keeper reloaded its credentials;
    - neither was refused (401) for more than REFUSED_FOR seconds at any time: the publisher's
      netclaim_api_unauthorized_consecutive > 0 over consecutive scrapes, the keeper's refusals in its log.
    Times in the problems are seconds after `t0`.
    """
    problems: list[str] = []
    per: list[dict[str, Any]] = []
    bounds = [r.written for r in rotations[1:]] + [end]
    for r, until in zip(rotations, bounds):
        row: dict[str, Any] = {"generation": r.generation, "written": round(r.written, 1)}
        after = sorted((first, sid) for sid, (created, first) in shown.items() if created > r.written and first <= until)
        if not after:
            problems.append(f"generation {r.generation}: no claimed pod started after the rotation was shown by its claim")
        else:
            row["claimed_shown_after_s"] = round(after[0][0] - r.written, 1)
        mine = [s for s in scrapes if s.pid == r.publisher_pid]
        before = [s.reloads for s in mine if s.t <= r.written]
        later = [s for s in mine if r.written < s.t <= until]
        if before and later and after and later[-1].t >= after[0][0]:
            row["publisher_reloads"] = [before[-1], later[-1].reloads]
            if later[-1].reloads <= before[-1]:
                problems.append(f"generation {r.generation}: the publisher (pid {r.publisher_pid}) applied after the "
                                f"rotation but counted no credential reload ({before[-1]:g} -> {later[-1].reloads:g})")
        elif not after:
            row["publisher_reloads"] = "not judged: no claimed pod was shown after the rotation"
        else:
            row["publisher_reloads"] = "not judged: the publisher process was replaced before its reload could be seen"
        restarts = [t for t in apiserver_restarts if r.written < t <= until]
        if restarts:
            reloads = [k.t for k in keeper if k.kind == "reloaded" and r.written < k.t <= until]
            row["keeper_reloaded_after_s"] = round(reloads[0] - r.written, 1) if reloads else None
            if not reloads:
                problems.append(f"generation {r.generation}: the keeper listed again after an API server restart "
                                "but never reloaded its credentials")
        else:
            row["keeper_reloaded_after_s"] = "not judged: no API server restart before the next rotation"
        per.append(row)
    streaks: list[tuple[float, float]] = []
    for pid in sorted({s.pid for s in scrapes}):
        mine = sorted((s for s in scrapes if s.pid == pid), key=lambda s: s.t)
        start, counted = None, False
        for s in mine:
            if s.unauthorized <= 0:
                start, counted = None, False
                continue
            start = s.t if start is None else start
            if s.t - start > REFUSED_FOR and not counted:
                streaks.append((start, s.t))
                counted = True  # once per stretch
    for a, b in streaks:
        problems.append(f"the publisher's API requests were refused (401) from {a - t0:.0f}s to {b - t0:.0f}s "
                        f"(over {REFUSED_FOR:.0f}s)")
    for a, b in refused_spans([k.t for k in keeper if k.kind == "refused"], end):
        if b - a > REFUSED_FOR:
            problems.append(f"the keeper was refused (401) from {a - t0:.0f}s to {b - t0:.0f}s: {b - a:.0f}s")
    return {"ok": bool(rotations) and not problems, "rotations": per,
            "problems": problems if rotations else ["no rotation was injected"]}
