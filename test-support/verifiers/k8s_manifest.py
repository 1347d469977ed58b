"""Independent reader of a Kubernetes manifest file (PyYAML, no Ratchet code): what the StatefulSet's first
container is started with, as JSON, so a test can run the binary exactly so.

usage: k8s_manifest.py MANIFEST.yaml

Prints {"replicas": n, "args": [...], "env": {name: value | {"fieldRef": path} | {"secretKeyRef": ...}},
"readiness": {"path", "port"}, "liveness": {"path", "port"}, "ports": {name: number}, "config_maps":
{name: {key: text}}, "mounts": {mountPath: configMapName}}. Fails when the file holds no StatefulSet.
"""

import json
import sys

import yaml


def main(path: str) -> None:
    with open(path) as f:
        documents = [d for d in yaml.safe_load_all(f) if d]
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in documents if d["kind"] == "ConfigMap"}
    sets = [d for d in documents if d["kind"] == "StatefulSet"]
    if not sets:
        raise SystemExit(f"{path}: no StatefulSet")
    spec = sets[0]["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        else:
            source = e["valueFrom"]
            kind = next(iter(source))
            env[e["name"]] = {kind: source[kind].get("fieldPath", source[kind])}
    volumes = {v["name"]: v.get("configMap", {}).get("name") for v in pod.get("volumes", [])}
    probe = lambda p: {"path": p["httpGet"]["path"], "port": p["httpGet"]["port"]} if p else None
    print(
        json.dumps(
            {
                "replicas": spec["replicas"],
                "args": [str(a) for a in container.get("args", [])],
                "env": env,
                "readiness": probe(container.get("readinessProbe")),
                "liveness": probe(container.get("livenessProbe")),
                "ports": {p["name"]: p["containerPort"] for p in container.get("ports", [])},
                "config_maps": config_maps,
                "mounts": {m["mountPath"]: volumes.get(m["name"]) for m in container.get("volumeMounts", [])},
            }
        )
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
