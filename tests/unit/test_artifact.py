"""A model version as a content-addressed image: the file manifest, the deterministic layer,
the OCI documents, publishing only what a registry lacks (against an in-memory registry that
checks digests as the distribution spec says), and the host's checks of pulled files (the
real shell scripts, run here on temporary directories)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tfsdeploy.core.artifact import (
    CONFIG_TYPE,
    LAYER_TYPE,
    MANIFEST_TYPE,
    ArtifactError,
    FileEntry,
    FileManifest,
    mismatches,
    model_repo,
    parse_sums,
    repository_component,
)
from tfsdeploy.core.errors import ConfigError
from tfsdeploy.hosts.commands import pull as pull_commands
from tfsdeploy.hosts.registry import Registry, RegistryError, docker_login
from tfsdeploy.run.operations.stage import VersionArchive
from tfsdeploy.run.publish import pack, publish, write_layer
from tfsdeploy.run.sources import SourceError


def _version(root: Path) -> Path:
    (root / "variables").mkdir(parents=True)
    (root / "saved_model.pb").write_bytes(b"graph" * 100)
    (root / "variables" / "variables.index").write_bytes(b"index")
    (root / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(3000))
    return root


# -- the manifest -------------------------------------------------------------------------------

def test_the_manifest_gives_the_digest_a_push_records(tmp_path: Path) -> None:
    """Both transfers record the same digest for the same files: a host staged by push is
    reused after the inventory switches to pull, and the reverse."""
    version = _version(tmp_path / "1")
    packed = pack("m", 1, version)
    archive = VersionArchive(version)
    assert packed.files.sums() == archive.sums()
    assert packed.files.digest() == archive.digest()
    sizes = {e.path: e.size for e in packed.files.files}
    assert sizes == {"saved_model.pb": 500, "variables/variables.index": 5,
                     "variables/variables.data-00000-of-00001": 3000}
    assert packed.files.total_bytes == 3505


def test_a_whiteout_name_is_refused_with_the_way_out() -> None:
    with pytest.raises(ArtifactError, match=r"assets/\.wh\.x.*whiteout.*push"):
        FileManifest.of([FileEntry("assets/.wh.x", "0" * 64, 1)])


def test_sums_lines_are_parsed_or_refused() -> None:
    good = f"{'a' * 64}  saved_model.pb\n{'b' * 64}  variables/x y\n"
    assert parse_sums(good) == {"saved_model.pb": "a" * 64, "variables/x y": "b" * 64}
    with pytest.raises(ArtifactError, match="line 1"):
        parse_sums("nothex  file\n")


def test_mismatches_name_every_difference() -> None:
    expected = FileManifest.of([FileEntry("a", "1" * 64, 3), FileEntry("b", "2" * 64, 4),
                                FileEntry("c", "3" * 64, 5)])
    seen = {"a": ("1" * 64, 3), "b": ("9" * 64, 4), "c": ("3" * 64, 6), "d": ("4" * 64, 1)}
    assert mismatches(expected, seen) == [
        "d: not in the manifest", "b: sha256 999999999999, the manifest says 222222222222",
        "c: 6 bytes, the manifest says 5"]
    assert mismatches(expected, {"a": ("1" * 64, 3)}) == ["b: missing", "c: missing"]
    assert mismatches(expected, {e.path: (e.sha256, e.size) for e in expected.files}) == []


# -- the layer and the image ------------------------------------------------------------------

def test_the_layer_holds_only_the_version_deterministically(tmp_path: Path) -> None:
    version = _version(tmp_path / "1")
    buffer = io.BytesIO()
    files = write_layer(version, buffer)
    with tarfile.open(fileobj=io.BytesIO(buffer.getvalue())) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == ["version", "version/variables", "version/saved_model.pb",
                         "version/variables/variables.data-00000-of-00001",
                         "version/variables/variables.index"]
        for member in members:
            assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == \
                (0, 0, 0, "", "")
            assert member.mode == (0o755 if member.isdir() else 0o644)
        body = tar.extractfile("version/saved_model.pb")
        assert body is not None and body.read() == b"graph" * 100
    assert files == pack("m", 1, version).files


def test_the_same_files_give_the_same_digest_whatever_their_times_and_modes(
        tmp_path: Path) -> None:
    first = pack("m", 1, _version(tmp_path / "a"))
    copy = tmp_path / "b"
    os.system(f"cp -r {tmp_path / 'a'} {copy}")
    (copy / "saved_model.pb").chmod(0o600)
    os.utime(copy / "saved_model.pb", (1, 1))
    again = pack("m", 1, copy)
    assert again.digest == first.digest and again.layer == first.layer
    (copy / "variables" / "variables.index").write_bytes(b"other")
    assert pack("m", 1, copy).digest != first.digest
    assert pack("m", 2, tmp_path / "a").digest != first.digest  # the version is in the labels


def test_the_image_documents_follow_the_oci_image_spec(tmp_path: Path) -> None:
    packed = pack("resnet50", 7, _version(tmp_path / "7"))
    manifest = json.loads(packed.manifest)
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == MANIFEST_TYPE
    assert manifest["config"] == {"mediaType": CONFIG_TYPE, "size": len(packed.config),
                                  "digest": "sha256:" + hashlib.sha256(packed.config).hexdigest()}
    assert manifest["layers"] == [{"mediaType": LAYER_TYPE, "digest": packed.layer.digest,
                                   "size": packed.layer.size}]
    config = json.loads(packed.config)
    # uncompressed layer: its diff_id is its digest
    assert config["rootfs"] == {"type": "layers", "diff_ids": [packed.layer.digest]}
    assert (config["os"], "created" in config) == ("linux", False)
    labels = config["config"]["Labels"]
    assert json.loads(labels["dev.tfsdeploy.files"])[0] == [
        "saved_model.pb", hashlib.sha256(b"graph" * 100).hexdigest(), 500]
    assert packed.digest == "sha256:" + hashlib.sha256(packed.manifest).hexdigest()


def test_a_file_that_changes_between_hash_and_upload_is_refused(tmp_path: Path) -> None:
    version = _version(tmp_path / "1")
    packed = pack("m", 1, version)
    (version / "saved_model.pb").write_bytes(b"new weights")
    registry = Registry("reg:5000", insecure=True,
                        transport=httpx.MockTransport(FakeRegistry().handle))
    with pytest.raises(SourceError, match="changed since they were hashed"):
        publish(packed, registry, "reg:5000/models")


# -- names --------------------------------------------------------------------------------------

def test_model_names_become_repository_components() -> None:
    assert repository_component("resnet50") == "resnet50"
    assert repository_component("half_plus_two") == "half_plus_two"
    upper = repository_component("ResNet50")
    assert upper.startswith("resnet50-") and upper != repository_component("resnet50")
    assert repository_component("a--b") == "a--b"  # '-+' joins components
    assert repository_component("a.-b").startswith("a-b-")
    repo = model_repo("10.0.0.1:5000/fleet/models/", "ResNet50")
    assert repo.registry == "10.0.0.1:5000" and repo.repository == f"fleet/models/{upper}"
    assert repo.reference("sha256:ab") == f"10.0.0.1:5000/fleet/models/{upper}@sha256:ab"


@pytest.mark.parametrize("prefix", ["registry:5000", "registry:5000/Models", "/models", ""])
def test_a_prefix_that_names_no_repository_is_refused(prefix: str) -> None:
    with pytest.raises(ArtifactError, match="model_registry"):
        model_repo(prefix, "m")


def test_the_inventory_refuses_a_wrong_model_registry_and_pull_without_one(
        tmp_path: Path) -> None:
    from tfsdeploy.core.inventory.load import load_inventory
    from tfsdeploy.core.target import load_target
    from tfsdeploy.run.plans import check_transfer

    source = _version(tmp_path / "src" / "1").parent
    text = ('from tfsdeploy.core.inventory.catalog import Model, Signature, TensorSpec\n'
            'x = {"x": TensorSpec("DT_FLOAT", (-1, 1))}\n'
            'from tfsdeploy.core.inventory.fleet import Host\n'
            'hosts = [Host("h1", "10.0.0.1", vars={HV})]\n'
            f'models = [Model(name="m", source={str(source)!r}, signature=Signature(x, x), '
            'memory_mib=512, latency_slo_ms=50)]\n')
    bad = tmp_path / "bad.py"
    bad.write_text(text.replace("{HV}", '{"model_registry": "reg:5000"}'))
    with pytest.raises(ConfigError, match="model_registry"):
        load_inventory(str(bad))
    missing = tmp_path / "missing.py"
    missing.write_text(text.replace("{HV}", '{"model_transfer": "pull"}'))
    with pytest.raises(ConfigError, match="no model_registry is set for h1"):
        check_transfer(load_target("m", inventory=str(missing)))


# -- publishing -------------------------------------------------------------------------------

class FakeRegistry:
    """The distribution API's push half in memory: blobs HEAD/POST/PUT (the digest checked),
    manifests HEAD/PUT; every request recorded."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}
        self.calls: list[str] = []
        self.required: str | None = None  # an Authorization header every call must carry

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append(f"{request.method} {path}")
        if self.required and request.headers.get("Authorization") != self.required:
            return httpx.Response(401, headers={"WWW-Authenticate": 'Basic realm="reg"'})
        if path.endswith("/blobs/uploads/") and request.method == "POST":
            return httpx.Response(202, headers={"Location": "/v2/upload/abc?state=1"})
        if path == "/v2/upload/abc" and request.method == "PUT":
            digest = request.url.params["digest"]
            body = request.read()
            if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
                return httpx.Response(400, text='{"errors":[{"code":"DIGEST_INVALID"}]}')
            self.blobs[digest] = body
            return httpx.Response(201)
        kind, _, reference = path.rpartition("/")
        store = self.blobs if kind.endswith("/blobs") else self.manifests
        if request.method == "HEAD":
            return httpx.Response(200 if reference in store else 404)
        if request.method == "PUT" and kind.endswith("/manifests"):
            body = request.read()
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            missing = [d["digest"] for d in [json.loads(body)["config"],
                                             *json.loads(body)["layers"]]
                       if d["digest"] not in self.blobs]
            if missing:
                return httpx.Response(400, text='{"errors":[{"code":"BLOB_UNKNOWN"}]}')
            self.manifests[digest] = self.manifests[reference] = body
            return httpx.Response(201, headers={"Docker-Content-Digest": digest})
        return httpx.Response(405)


def _registry(fake: FakeRegistry, **kwargs: Any) -> Registry:
    return Registry("reg:5000", insecure=True, transport=httpx.MockTransport(fake.handle),
                    **kwargs)


def test_a_second_publish_pushes_nothing_and_names_the_same_digest(tmp_path: Path) -> None:
    fake = FakeRegistry()
    packed = pack("m", 1, _version(tmp_path / "1"))
    first = publish(packed, _registry(fake), "reg:5000/models")
    assert first.uploaded == ("layer", "config", "manifest")
    assert first.uploaded_bytes == packed.layer.size + len(packed.config) + len(packed.manifest)
    assert fake.blobs[packed.layer.digest] == _layer_bytes(tmp_path / "1")
    assert first.reference == f"reg:5000/models/m@{packed.digest}"
    fake.calls.clear()
    again = publish(pack("m", 1, tmp_path / "1"), _registry(fake), "reg:5000/models")
    assert (again.digest, again.uploaded, again.uploaded_bytes) == (first.digest, (), 0)
    assert fake.calls == [f"HEAD /v2/models/m/manifests/{packed.digest}"]
    assert "nothing pushed" in again.describe()


def test_a_publish_cut_after_the_layer_sends_only_the_rest(tmp_path: Path) -> None:
    fake = FakeRegistry()
    packed = pack("m", 1, _version(tmp_path / "1"))
    fake.blobs[packed.layer.digest] = _layer_bytes(tmp_path / "1")
    done = publish(packed, _registry(fake), "reg:5000/models")
    assert done.uploaded == ("config", "manifest")


def _layer_bytes(version: Path) -> bytes:
    buffer = io.BytesIO()
    write_layer(version, buffer)
    return buffer.getvalue()


def test_the_login_of_this_machine_is_sent_when_the_registry_asks(tmp_path: Path,
                                                                  monkeypatch: Any) -> None:
    import base64

    config = tmp_path / "docker"
    config.mkdir()
    secret = base64.b64encode(b"ci:s3cret").decode()
    (config / "config.json").write_text(json.dumps({"auths": {"reg:5000": {"auth": secret}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    assert docker_login("reg:5000") == ("ci", "s3cret")
    assert docker_login("other:5000") is None
    fake = FakeRegistry()
    fake.required = f"Basic {secret}"
    packed = pack("m", 1, _version(tmp_path / "1"))
    assert publish(packed, _registry(fake), "reg:5000/models").uploaded[-1] == "manifest"
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))
    fresh = FakeRegistry()
    fresh.required = f"Basic {secret}"
    with pytest.raises(RegistryError, match=r"HTTP 401.*docker login reg:5000"):
        publish(packed, _registry(fresh), "reg:5000/models")


def test_an_unreachable_registry_is_named() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    registry = Registry("reg:5000", insecure=True, transport=httpx.MockTransport(refuse))
    with pytest.raises(RegistryError, match=r"registry reg:5000 unreachable.*refused"):
        registry.has_blob("models/m", "sha256:00")


# -- the host's checks (the real scripts) -------------------------------------------------------

def _staged(tmp_path: Path) -> tuple[Path, FileManifest]:
    staging = tmp_path / ".pull-1"
    version = _version(staging / "version")
    files = pack("m", 1, version).files
    (staging / "SHA256SUMS").write_text(files.sums())
    return staging, files


def _sh(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_pulled_files_that_match_pass_and_stay(tmp_path: Path) -> None:
    staging, _ = _staged(tmp_path)
    result = _sh(pull_commands.verify_pulled(str(staging)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in staging.iterdir()) == ["SHA256SUMS", "version"]


@pytest.mark.parametrize("damage, named", [
    (lambda v: (v / "saved_model.pb").write_bytes(b"corrupt"), "saved_model.pb: FAILED"),
    (lambda v: (v / "variables" / "variables.index").unlink(),
     "missing: variables/variables.index"),
    (lambda v: (v / "extra.bin").write_bytes(b"x"), "not in the manifest: extra.bin"),
])
def test_pulled_files_that_differ_are_refused_by_name_and_removed(
        tmp_path: Path, damage: Any, named: str) -> None:
    staging, _ = _staged(tmp_path)
    damage(staging / "version")
    result = _sh(pull_commands.verify_pulled(str(staging)))
    assert result.returncode == pull_commands.MISMATCH
    assert "differ from the manifest" in result.stdout and named in result.stdout
    assert not staging.exists()  # nothing a server could load, nothing left to trust


def test_no_space_is_said_before_the_pull(tmp_path: Path) -> None:
    result = _sh(pull_commands.free_space(str(tmp_path / "models"), need_bytes=1 << 60,
                                          image_bytes=1))
    assert result.returncode == pull_commands.NO_SPACE
    assert result.stdout.startswith(f"no space: {tmp_path / 'models'} has ")
    ok = _sh(pull_commands.free_space(str(tmp_path / "models"), need_bytes=1, image_bytes=1))
    assert ok.returncode == 0, ok.stdout + ok.stderr


# -- the pull bound -----------------------------------------------------------------------------

def test_no_more_hosts_pull_at_once_than_max_pulls() -> None:
    """The executor holds one of the run's pull slots for each host's pull (--max-pulls)."""
    import threading
    from types import SimpleNamespace

    from tfsdeploy.run.changes import PullModel
    from tfsdeploy.run.executor import apply_change
    from tfsdeploy.run.plans import pull_slots

    lock, state = threading.Lock(), {"now": 0, "most": 0}
    release = threading.Event()

    def pull(reference: str, on_progress: Any) -> None:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        release.wait(0.2)
        with lock:
            state["now"] -= 1

    run = SimpleNamespace(pull_slots=pull_slots(2))
    jobs = [SimpleNamespace(name=f"h{i}", run=run, conn=SimpleNamespace(
        docker=SimpleNamespace(pull=pull))) for i in range(6)]
    change = PullModel("reg:5000/models/m@sha256:00", what="version 1")
    threads = [threading.Thread(target=apply_change, args=(job, "stage_model", change,
                                                           lambda host, p: None))
               for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert state["most"] == 2
    assert pull_slots(None)._initial_value == 8  # type: ignore[attr-defined]


def test_publish_without_any_model_registry_is_a_config_error(tmp_path: Path) -> None:
    from tfsdeploy.core.target import load_target
    from tfsdeploy.run.stage import registries

    source = _version(tmp_path / "src" / "1").parent
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        'from tfsdeploy.core.inventory.catalog import Model, Signature, TensorSpec\n'
        'from tfsdeploy.core.inventory.fleet import Host\n'
        'x = {"x": TensorSpec("DT_FLOAT", (-1, 1))}\n'
        'hosts = [Host("h1", "10.0.0.1"), Host("h2", "10.0.0.2", vars={"model_registry": '
        '"reg:5000/models", "model_registry_insecure": True})]\n'
        f'models = [Model(name="m", source={str(source)!r}, signature=Signature(x, x), '
        'memory_mib=512, latency_slo_ms=50)]\n')
    assert registries(load_target("m", inventory=str(inventory))) == [("reg:5000/models", True)]
    with pytest.raises(ConfigError, match="no selected host of m names a model_registry"):
        registries(load_target("m", inventory=str(inventory), hosts="h1"))
