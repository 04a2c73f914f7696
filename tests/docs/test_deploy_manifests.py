"""deploy/ and docs/deploy.md, checked without a cluster or a network: the Kubernetes manifests against
the Kubernetes JSON schemas (kubernetes-validate ships them in its wheel), the probes, where secrets come
from, the systemd unit's keys, and every `tessera` command and variable the deployment names against the
real CLI and source."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from tessera.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
UNIT = DEPLOY / "systemd" / "tessera-server@.service"
ENV_EXAMPLE = DEPLOY / "systemd" / "server.env.example"
DOCKERFILE = DEPLOY / "container" / "Dockerfile"
DOC = ROOT / "docs" / "deploy.md"
K8S_VERSIONS = ("1.29", "1.37")   # the oldest Kubernetes the manifests claim, and the newest schema shipped
HEALTH = "/api/v1/health"
SECRET_VARIABLES = {"TESSERA_DB_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "TESSERA_SECRET_KEY"}
PLACEHOLDERS = ("CHANGE_ME", "PASSWORD", "...")


def manifests() -> list[tuple[str, dict]]:
    """(file name, object) of every YAML document in deploy/kubernetes/ but the kustomization."""
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def one(kind: str) -> dict:
    [found] = [doc for _, doc in manifests() if doc["kind"] == kind]
    return found


def test_every_manifest_validates_against_the_kubernetes_schemas() -> None:
    problems = []
    for name, doc in manifests():
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{name} ({version}): {'.'.join(map(str, exc.path))}: {exc.message}")
            except kubernetes_validate.SchemaNotFoundError as exc:
                problems.append(f"{name} ({version}): {exc.message}")
    assert problems == []
    kinds = sorted(doc["kind"] for _, doc in manifests())
    assert kinds == ["ConfigMap", "Deployment", "Ingress", "PodDisruptionBudget", "Service"]
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_schema_check_refuses_a_broken_deployment() -> None:
    """The validation above can fail: a misspelt field and a wrong type are both refused."""
    deployment = one("Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="'readinesProbe' was unexpected"):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    deployment = one("Deployment")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError) as refused:
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    assert list(refused.value.path) == ["spec", "replicas"]


def test_two_unprivileged_replicas_probed_on_health_behind_one_service() -> None:
    deployment, service, pdb, ingress = one("Deployment"), one("Service"), one("PodDisruptionBudget"), one("Ingress")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["replicas"] == 2
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"] == spec["selector"] and pdb["spec"]["minAvailable"] == 1
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = container["args"]
    assert ports == {"http": int(args[args.index("--port") + 1])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": HEALTH, "port": "http"}, probe
    [service_port] = service["spec"]["ports"]
    assert service_port["targetPort"] in ports
    [rule] = ingress["spec"]["rules"]
    [path] = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": service_port["name"]}}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}


def test_secret_values_come_from_secrets_the_doc_makes() -> None:
    container = one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item for item in container["env"]}
    from_secrets = {name: item["valueFrom"]["secretKeyRef"] for name, item in env.items()
                    if "secretKeyRef" in item.get("valueFrom", {})}
    assert set(from_secrets) == SECRET_VARIABLES
    doc = DOC.read_text()
    for name, ref in from_secrets.items():   # each Secret and key is one the doc tells the reader to make
        assert f"create secret generic {ref['name']} --from-env-file=" in doc, ref
        assert ref["key"] == name
    config = one("ConfigMap")["data"]
    from_config = {item["valueFrom"]["configMapKeyRef"]["key"] for item in env.values()
                   if "configMapKeyRef" in item.get("valueFrom", {})}
    assert from_config == set(config)
    assert "Secret" not in {doc["kind"] for _, doc in manifests()}


SECRET_PATTERNS = {
    "a database URL with a password": re.compile(r"\b[a-z][a-z0-9+]*://[^\s:/@'\"]+:([^\s@/'\"]+)@"),
    "an AWS access key id": re.compile(r"\b((?:AKIA|ASIA)[0-9A-Z]{16})\b"),
    "a Fernet key": re.compile(r"(?<![\w-])([A-Za-z0-9_-]{43}=)"),
    "a Tessera API key": re.compile(r"\b(tsk_[A-Za-z0-9_-]{43})"),
    "a secret variable's value": re.compile(rf"\b(?:{'|'.join(sorted(SECRET_VARIABLES))})[=:]\s*['\"]?([^\s'\"]+)"),
}


def secret_values(text: str) -> list[str]:
    """What in `text` looks like a secret value rather than a placeholder."""
    found = []
    for what, pattern in SECRET_PATTERNS.items():
        for match in pattern.finditer(text):
            value = match.group(1)
            if not any(p in value for p in PLACEHOLDERS) and not value.startswith(("$", "<", "{", "%")):
                found.append(f"{what}: {value[:6]}...")
    return found


def test_no_secret_value_is_written_in_the_deployment() -> None:
    files = [p for p in sorted(DEPLOY.rglob("*")) if p.is_file()] + [DOC]
    found = {str(p.relative_to(ROOT)): secret_values(p.read_text()) for p in files}
    assert {name: values for name, values in found.items() if values} == {}
    assert len(files) >= 10


def test_the_secret_scan_finds_real_looking_values() -> None:
    """The scan above can fail: each kind of value is caught, and the deployment's placeholders are not."""
    planted = ("TESSERA_DB_URL=postgresql+psycopg://tessera:hunter22@db:5432/tessera\n"
               "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\n"
               "key: cw_0x689RpI-jtRR7oE8h_eQsKImvJapLeSbXpwF4e4=\n"
               "curl -H 'Authorization: Bearer tsk_" + "a" * 43 + "'\n")
    assert [hit.split(":")[0] for hit in secret_values(planted)] == [
        "a database URL with a password", "an AWS access key id", "a Fernet key", "a Tessera API key",
        "a secret variable's value", "a secret variable's value"]
    assert secret_values(ENV_EXAMPLE.read_text()) == []


def unit_keys(text: str) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit as {section: [(key, value), ...]} (a key may repeat, as systemd allows)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None and "=" in line, f"{UNIT.name}:{number}: neither [Section] nor Key=value: {raw!r}"
        key, value = line.split("=", 1)
        current.append((key.strip(), value.strip()))
    return sections


def test_the_systemd_unit_reads_its_values_from_root_only_files() -> None:
    sections = unit_keys(UNIT.read_text())
    assert set(sections) == {"Unit", "Service", "Install"}
    service = dict(sections["Service"])   # no key of these repeats
    assert len(service) == len(sections["Service"])
    assert service["User"] == "tessera" and service["Type"] == "exec"
    assert service["EnvironmentFile"] == "/etc/tessera/server.env"
    assert service["LoadCredential"] == "secret-key:/etc/tessera/secret.key"
    assert service["Environment"] == "TESSERA_SECRET_KEY_FILE=%d/secret-key"
    assert service["StateDirectory"] == "tessera/%i" and service["StateDirectoryMode"] == "0700"
    argv = shlex.split(service["ExecStart"])
    assert argv[:4] == ["/opt/tessera/venv/bin/tessera", "server", "start", "--host"]
    assert argv[argv.index("--port") + 1] == "%i" and argv[argv.index("--home") + 1] == "/var/lib/tessera/%i"
    assert "--db" not in argv
    assert dict(sections["Install"]) == {"WantedBy": "multi-user.target"}
    env_keys = [line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
                if line and not line.startswith("#")]
    assert env_keys == ["TESSERA_DB_URL", "TESSERA_ARTIFACTS_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                        "AWS_REGION"]
    doc = DOC.read_text()
    assert f"```ini\n{UNIT.read_text()}```" in doc   # the page shows the unit as it is
    assert "install -m 600 -o root -g root deploy/systemd/server.env.example /etc/tessera/server.env" in doc


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """systemd's own parser (no running systemd needed); ExecStart names this venv's tessera, which exists."""
    tessera = Path(sys.executable).parent / "tessera"
    (tmp_path / UNIT.name).write_text(UNIT.read_text().replace("/opt/tessera/venv/bin/tessera", str(tessera)))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "tessera-server@8080.service")],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def code_of(markdown: str) -> list[str]:
    """The fenced blocks and the inline code spans of a Markdown page."""
    fences = re.compile(r"^```[\w-]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
    return fences.findall(markdown) + re.findall(r"`([^`\n]+)`", fences.sub("", markdown))


def tessera_commands(text: str) -> list[list[str]]:
    """The arguments of each `tessera` (or `.../bin/tessera`) command in shell-like text: after `VAR=x`
    prefixes and `kubectl ... --`, and as a unit's ExecStart."""
    text = re.sub(r"^ExecStart=", "", text.replace("\\\n", " "), flags=re.MULTILINE)
    commands = []
    for segment in re.split(r"&&|\|\||[;|()\n]|\$\(", text):
        try:
            tokens = shlex.split(segment, comments=True)
        except ValueError:   # a quote opened in another segment
            continue
        while tokens and re.fullmatch(r"[A-Za-z_]\w*=.*", tokens[0]):
            tokens.pop(0)
        if tokens[:1] == ["kubectl"] and "--" in tokens:
            tokens = tokens[tokens.index("--") + 1:]
        if tokens and Path(tokens[0]).name == "tessera":
            commands.append(tokens[1:])
    return commands


@cache
def cli_help(path: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """(options, sub-commands) that `tessera PATH --help` lists, run in this process."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"}, prog_name="tessera")
    assert result.exit_code == 0, f"tessera {' '.join(path)} --help exited {result.exit_code}: {result.output[-2000:]}"
    options, commands, panel = set(), set(), ""
    for line in result.output.splitlines():
        if line.startswith("╭─"):
            panel = line.strip("╭─ ").split(" ")[0]
        elif line.startswith("│ ") and panel == "Options":
            flags = re.match(r"[*\s]*((?:-{1,2}[\w-]+[\s,/]*)+)", line[2:])
            options.update(re.findall(r"-{1,2}[\w-]+", flags.group(1)) if flags else ())
        elif line.startswith("│ ") and panel == "Commands" and (name := re.match(r"([a-z][\w-]*)\s", line[2:])):
            commands.add(name.group(1))
    return frozenset(options), frozenset(commands)


def unknown_options(args: list[str]) -> list[str]:
    """`tessera ARGS`'s sub-commands and options that the CLI does not have, e.g. ['server start --bogus']."""
    path: tuple[str, ...] = ()
    missing = []
    for arg in args:
        options, commands = cli_help(path)
        if arg.startswith("-") and arg.split("=", 1)[0] not in options:
            missing.append(f"{' '.join(path)} {arg.split('=', 1)[0]}".strip())
        elif not arg.startswith("-") and commands:   # a group: the word must be one of its commands
            if arg not in commands:
                return [*missing, f"{' '.join(path)} {arg} (no such command)".strip()]
            path += (arg,)
    return missing


def deployment_commands() -> list[list[str]]:
    """Every `tessera` command of the page, the unit, the Deployment's container and the image's default.
    An inline span of the page that starts with an option (`--db URL`) is one of `tessera server start`."""
    code = code_of(DOC.read_text())
    found = [cmd for text in code for cmd in tessera_commands(text)]
    found += [["server", "start", *shlex.split(text)] for text in code if text.startswith("--")]
    found += tessera_commands(UNIT.read_text())
    for container in one("Deployment")["spec"]["template"]["spec"]["containers"]:
        found.append([*container["command"], *container["args"]][1:])
    dockerfile = DOCKERFILE.read_text()
    found.append(yaml.safe_load(re.search(r"^CMD (.*)$", dockerfile, re.MULTILINE).group(1)))
    return found


def test_the_option_check_finds_what_the_cli_lacks() -> None:
    assert unknown_options(["server", "start", "--port", "1", "--bogus", "--log-level=info"]) == ["server start --bogus"]
    assert unknown_options(["sever", "start"]) == ["sever (no such command)"]
    assert tessera_commands("A=1 /opt/v/bin/tessera server start --port %i  # c\nuseradd tessera && "
                            "kubectl exec d -- tessera login URL") == [["server", "start", "--port", "%i"], ["login", "URL"]]


def test_the_deployment_names_real_tessera_options() -> None:
    commands = deployment_commands()
    assert len(commands) >= 20 and ["server", "start"] == commands[-1][:2]
    missing = sorted({m for cmd in commands for m in unknown_options(cmd)})
    assert missing == [], f"not in the CLI: {missing}"


def test_the_deployment_names_variables_tessera_reads() -> None:
    source = "\n".join(p.read_text() for p in sorted((ROOT / "src" / "tessera").rglob("*.py")))
    texts = [DOC.read_text()] + [p.read_text() for p in sorted(DEPLOY.rglob("*")) if p.is_file()]
    named = {name for text in texts for name in re.findall(r"\b(?:TESSERA|AWS|S3)_[A-Z0-9_]*[A-Z0-9]\b", text)}
    assert SECRET_VARIABLES | {"TESSERA_SECRET_KEY_FILE", "AWS_REGION", "S3_ENDPOINT_URL"} <= named
    unread = sorted(name for name in named if f'"{name}"' not in source)
    assert unread == [], f"no Tessera code reads {unread}"
