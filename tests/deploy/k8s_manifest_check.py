#!/usr/bin/env python3
"""deploy/k8s/troupe.yaml agrees with troupe's Kubernetes adapter (clusterFromK8s): one Indexed Job
per group of TROUPE_K8S_GROUPS, named after it ('_' -> '-'), as many pods as it says, every pod
in the headless service's subdomain, the same TROUPE_K8S_GROUPS and service in every pod. The job
secret reaches every pod as a file only its owner can read (a secret volume of mode 0400, named by
TROUPE_TOKEN_FILE), never as an environment variable or an argument. A group's TROUPE_LABELS and
TROUPE_RESOURCES have the forms --labels and --resources take. Exits 77 (skipped) without
PyYAML.

usage: k8s_manifest_check.py MANIFEST
"""
import re
import sys

try:
    import yaml
except ImportError:
    print("skipped: PyYAML is not installed")
    sys.exit(77)

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
services = [d for d in docs if d["kind"] == "Service"]
jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Job", "StatefulSet")}
errors = []
assert len(services) == 1, "one headless service"
svc = services[0]
if svc["spec"].get("clusterIP") != "None":
    errors.append("the service is not headless")
for name, job in jobs.items():
    pod = job["spec"]["template"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    groups = dict(entry.split(":")[0].split("=") for entry in env["TROUPE_K8S_GROUPS"].split(","))
    service = env.get("TROUPE_K8S_SERVICE", "troupe")
    if service != svc["metadata"]["name"]:
        errors.append("%s: TROUPE_K8S_SERVICE %s is not the service" % (name, service))
    if pod["spec"].get("subdomain", job["spec"].get("serviceName")) != service:
        errors.append("%s: pods are not in the service's subdomain" % name)
    if job["kind"] == "Job" and job["spec"].get("completionMode") != "Indexed":
        errors.append("%s: not an Indexed Job (no stable hostnames)" % name)
    label = pod["metadata"]["labels"]
    if any(label.get(k) != v for k, v in svc["spec"]["selector"].items()):
        errors.append("%s: the service does not select its pods" % name)
    group = label.get("troupe.io/group")
    if group not in groups or group.replace("_", "-") != name:
        errors.append("%s: group label %r does not name it in TROUPE_K8S_GROUPS" % (name, group))
        continue
    forms = {"TROUPE_LABELS": r"[\w.\-/]+=[\w.\-/]+", "TROUPE_RESOURCES": r"[\w.\-/]+=\d+(\.\d{1,3})?"}
    for var, entry in forms.items():
        if env.get(var) and not re.fullmatch(r"%s(,%s)*" % (entry, entry), env[var]):
            errors.append("%s: %s %r is not KEY=VALUE[,...] as troupe takes it"
                          % (name, var, env[var]))
    container = pod["spec"]["containers"][0]
    if "TROUPE_TOKEN" in env or any("token" in str(a) for a in container.get("command", [])):
        errors.append("%s: the secret is in the environment or on the command line" % name)
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    token_file = env.get("TROUPE_TOKEN_FILE") or ""
    volume = volumes.get(mounts.get(token_file.rsplit("/", 1)[0]), {})
    secret = volume.get("secret", {})
    if not secret.get("secretName") or secret.get("defaultMode") not in (0o400, 0o600):
        errors.append("%s: TROUPE_TOKEN_FILE %r is not in a secret volume of mode 0400 or 0600"
                      % (name, token_file))
    if "fsGroup" in pod["spec"].get("securityContext", {}):
        errors.append("%s: an fsGroup makes the secret file group-readable; troupe refuses it"
                      % name)
    size = job["spec"].get("parallelism", job["spec"].get("replicas"))
    if int(groups[group]) != size or job["spec"].get("completions", size) != size:
        errors.append("%s: parallelism %s, completions %s; TROUPE_K8S_GROUPS says %s pods"
                      % (name, size, job["spec"].get("completions"), groups[group]))
for group in groups:
    if group.replace("_", "-") not in jobs:
        errors.append("group %s has no Job" % group)
for e in errors:
    print("MISMATCH:", e)
print("%d passed, %d failed" % (0 if errors else 1, 1 if errors else 0))
sys.exit(1 if errors else 0)
