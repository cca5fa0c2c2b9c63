"""The pod of an s3:// or hf:// model: the fetch init container, its cache volume, its env.

The rendered env is fed to the fetcher's own parser and the server's, so the
directory one writes is the directory the other loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from fusebox_contract.model_fetch import (
    FETCH_CONTAINER,
    FETCHED_MODEL_LINK,
    MODEL_CACHE_DIR,
    FetchEnv,
)
from fusebox_contract.names import Variant
from fusebox_contract.settings import FALLBACK_DIR, MODEL_DIR
from fusebox_contract.stats import RuntimeState, StatsDocument
from fusebox_operator.manifests import (
    MODEL_CACHE_VOLUME,
    MODEL_REVISION_ANNOTATION,
    build_deployment,
)
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import InferenceServiceSpec, SpecError, parse_spec
from fusebox_operator.status import model_entry
from fusebox_operator.telemetry import parse_metrics, sample_from_metrics
from fusebox_server.config import parse_config
from fusebox_server.fetch.__main__ import fetch_config
from fusebox_sidecar.collectors import relayed_families

from .pod_security import restricted_violations

GIB = 1024**3


def pod_of(model: dict[str, Any], **spec: Any) -> dict[str, Any]:
    parsed = parse_spec({"model": {"name": "chat", **model}, "gpu": {"count": 0}, **spec})
    deployment = build_deployment(
        parsed, "chat", "ml", size_memory(parsed, [1024]), OperatorSettings()
    )
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        c for c in [*pod["initContainers"], *pod["containers"]] if c["name"] == name
    )
    return found


def plain_env(of: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in of["env"] if "value" in e}


def secret_refs(of: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
    return {
        e["name"]: (
            e["valueFrom"]["secretKeyRef"]["name"],
            e["valueFrom"]["secretKeyRef"]["key"],
            e["valueFrom"]["secretKeyRef"].get("optional", False),
        )
        for e in of["env"]
        if "valueFrom" in e
    }


def volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(v for v in pod["volumes"] if v["name"] == name)
    return found


def test_an_s3_model_is_fetched_first_and_the_server_loads_the_pods_link_to_it() -> None:
    pod = pod_of({"source": "s3://models/tiny", "endpoint": "http://s3.local:7070"})
    # The native sidecar first: it runs on beside the fetcher and exports its progress.
    assert [c["name"] for c in pod["initContainers"]] == ["sidecar", FETCH_CONTAINER]
    fetcher, server = container(pod, FETCH_CONTAINER), container(pod, "server")
    config = fetch_config([], plain_env(fetcher))
    assert config.source == "s3://models/tiny"
    assert config.s3_endpoint == "http://s3.local:7070"
    assert str(config.model_dir).startswith(MODEL_CACHE_DIR + "/")
    # The server loads the link the fetcher points at the revision it verified: in the
    # runtime volume, the pod's own, which both mount and which outlives a restart.
    served = parse_config([], plain_env(server), read_files=False)
    assert str(config.model_link) == str(served.model_dir) == FETCHED_MODEL_LINK
    runtime = {"name": "runtime", "mountPath": str(Path(FETCHED_MODEL_LINK).parent)}
    assert runtime in fetcher["volumeMounts"] and runtime in server["volumeMounts"]
    assert "emptyDir" in volume(pod, "runtime")
    # The link's target is in the cache, which the server mounts where the fetcher does.
    assert {"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_DIR} in fetcher["volumeMounts"]
    assert {
        "name": MODEL_CACHE_VOLUME,
        "mountPath": MODEL_CACHE_DIR,
        "readOnly": True,
    } in server["volumeMounts"]
    assert restricted_violations(pod) == []


def test_without_a_claim_each_pod_gets_an_emptydir_counted_in_its_storage() -> None:
    small = pod_of({"source": "s3://models/tiny", "cache": {"sizeLimit": "2Gi"}})
    large = pod_of({"source": "s3://models/tiny", "cache": {"sizeLimit": "5Gi"}})
    assert volume(small, MODEL_CACHE_VOLUME) == {
        "name": MODEL_CACHE_VOLUME,
        "emptyDir": {"sizeLimit": "2Gi"},
    }

    def storage(pod: dict[str, Any]) -> str:
        return str(container(pod, "server")["resources"]["limits"]["ephemeral-storage"])

    local = pod_of({"source": "pvc://models/tiny"})
    assert storage(small) != storage(local)
    assert (int(storage(large).removesuffix("Mi")) - int(storage(small).removesuffix("Mi"))) == (
        3 * 1024
    )


def test_a_named_claim_is_the_shared_cache_and_not_counted_as_pod_storage() -> None:
    pod = pod_of({"source": "s3://models/tiny", "cache": {"claimName": "model-cache"}})
    assert volume(pod, MODEL_CACHE_VOLUME) == {
        "name": MODEL_CACHE_VOLUME,
        "persistentVolumeClaim": {"claimName": "model-cache"},
    }
    local = pod_of({"source": "pvc://models/tiny"})
    server, local_server = container(pod, "server"), container(local, "server")
    assert server["resources"]["limits"] == local_server["resources"]["limits"]


def test_the_fetcher_is_told_the_emptydirs_size_limit_and_not_a_claims() -> None:
    """The kubelet evicts a pod past its emptyDir's sizeLimit; the free space the fetcher
    sees is the node's, so it is told the limit to refuse a larger model (DiskFull)."""
    pod = pod_of({"source": "s3://models/tiny", "cache": {"sizeLimit": "2Gi"}})
    small = container(pod, FETCH_CONTAINER)
    assert plain_env(small)[FetchEnv.CACHE_SIZE_LIMIT_BYTES] == str(2 * GIB)
    assert fetch_config([], plain_env(small)).cache_size_limit_bytes == 2 * GIB  # as it reads it
    claimed = pod_of({"source": "hf://org/repo", "cache": {"claimName": "model-cache"}})
    on_claim = plain_env(container(claimed, FETCH_CONTAINER))
    assert FetchEnv.CACHE_SIZE_LIMIT_BYTES not in on_claim
    assert fetch_config([], on_claim).cache_size_limit_bytes is None


def test_s3_credentials_come_from_the_named_secret_by_reference_only() -> None:
    pod = pod_of(
        {"source": "s3://models/tiny", "region": "eu-west-1", "credentials": {"secretName": "s3"}}
    )
    fetcher = container(pod, FETCH_CONTAINER)
    assert secret_refs(fetcher) == {
        FetchEnv.S3_ACCESS_KEY: ("s3", "accessKeyId", False),
        FetchEnv.S3_SECRET_KEY: ("s3", "secretAccessKey", False),
        FetchEnv.S3_SESSION_TOKEN: ("s3", "sessionToken", True),
    }
    assert plain_env(fetcher)[FetchEnv.S3_REGION] == "eu-west-1"
    # Only the fetcher sees them: the server and the sidecar never do.
    assert secret_refs(container(pod, "server")) == {}
    assert secret_refs(container(pod, "sidecar")) == {}


def test_an_hf_model_gets_its_endpoint_its_token_and_the_pinned_revision() -> None:
    pod = pod_of(
        {
            "source": "hf://org/name@v2",
            "revision": "main",
            "endpoint": "http://hub.local:8090",
            "credentials": {"secretName": "hub"},
        }
    )
    fetcher = container(pod, FETCH_CONTAINER)
    assert secret_refs(fetcher) == {FetchEnv.HF_TOKEN: ("hub", "token", False)}
    config = fetch_config([], plain_env(fetcher))
    assert (config.hf_endpoint, config.revision) == ("http://hub.local:8090", "v2")
    assert FetchEnv.S3_ENDPOINT not in plain_env(fetcher)


def test_the_fetcher_goes_online_where_the_image_keeps_the_server_offline() -> None:
    """The image's ENV says offline (for the server); huggingface_hub, reading the
    fetcher's rendered env over it, must not refuse every request (it did on a cluster)."""
    fetcher = container(pod_of({"source": "hf://org/name"}), FETCH_CONTAINER)
    image_env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    probe = "import huggingface_hub.constants as c; print(c.is_offline_mode())"
    run = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PATH": os.environ["PATH"], **image_env, **plain_env(fetcher)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == "False", run.stdout
    server = plain_env(container(pod_of({"source": "hf://org/name"}), "server"))
    assert server["HF_HUB_OFFLINE"] == "1"  # the server never reaches the hub


def test_anonymous_sources_reference_no_secret() -> None:
    for source in ("s3://models/tiny", "hf://org/name"):
        assert secret_refs(container(pod_of({"source": source}), FETCH_CONTAINER)) == {}


def test_another_revision_is_another_directory() -> None:
    def model_dir(revision: str) -> str:
        pod = pod_of({"source": "hf://org/name", "revision": revision})
        return plain_env(container(pod, FETCH_CONTAINER))[FetchEnv.MODEL_DIR]

    assert model_dir("v1") != model_dir("v2")


def test_a_quantized_fallback_of_a_fetched_model_loads_the_fetched_copy() -> None:
    pod = pod_of({"source": "s3://models/tiny"}, fallback={"quantization": "int8"})
    env = plain_env(container(pod, "server"))
    assert env[FALLBACK_DIR.env] == env[MODEL_DIR.env]


@pytest.mark.parametrize("source", ["pvc://models/tiny", "file:///opt/model"])
def test_a_local_model_has_no_fetcher_and_no_cache(source: str) -> None:
    pod = pod_of({"source": source})
    assert [c["name"] for c in pod["initContainers"]] == ["sidecar"]
    assert all(v["name"] != MODEL_CACHE_VOLUME for v in pod["volumes"])


def template_of(model: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_spec({"model": {"name": "chat", **model}, "gpu": {"count": 0}})
    deployment = build_deployment(
        parsed, "chat", "ml", size_memory(parsed, [1024]), OperatorSettings()
    )
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def status_revision(spec: InferenceServiceSpec, served_revision: str) -> str | None:
    """status.model.revision once a pod's server reports `served_revision`: through the
    real sidecar's fusebox_model_info and the operator's scrape."""
    state = RuntimeState(variant=Variant.PRIMARY, model_revision=served_revision)

    class Relayed(Collector):
        def collect(self) -> Any:
            yield from relayed_families(StatsDocument(model_name="chat", state=state), 0.0)

    registry = CollectorRegistry()
    registry.register(Relayed())
    text = generate_latest(registry).decode()
    sample = sample_from_metrics("p", parse_metrics(text), 0.0, "ttft")
    return model_entry(spec, [sample], {}).get("revision")


def reported_revisions(model: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """The revision as the server reports it, as the pods carry it, and in status.model."""
    template = template_of(model)
    served = parse_config([], plain_env(container(template["spec"], "server")), read_files=False)
    annotation = template["metadata"]["annotations"].get(MODEL_REVISION_ANNOTATION)
    spec = parse_spec({"model": {"name": "chat", **model}})
    return served.model_revision, annotation, status_revision(spec, served.model_revision)


def test_an_hf_model_reports_the_revision_it_fetches_everywhere() -> None:
    # @REVISION is the revision fetched (model.revision stays at its default): v2 is
    # downloaded, so v2 is what the server, the pods and status say it serves.
    model = {"source": "hf://org/name@v2"}
    fetched = fetch_config([], plain_env(container(template_of(model)["spec"], FETCH_CONTAINER)))
    assert fetched.revision == "v2"
    assert reported_revisions(model) == ("v2", "v2", "v2")
    assert reported_revisions({"source": "hf://org/name", "revision": "v3"}) == ("v3", "v3", "v3")


def test_an_s3_model_reports_no_revision_a_bucket_has_none() -> None:
    assert reported_revisions({"source": "s3://models/tiny"}) == ("", None, None)


def test_a_local_model_reports_model_revision_as_given() -> None:
    assert reported_revisions({"source": "pvc://models/tiny", "revision": "v7"}) == (
        "v7",
        "v7",
        "v7",
    )


def test_a_revision_on_an_s3_source_is_refused_naming_it() -> None:
    with pytest.raises(SpecError, match=r"model.revision 'v2' has no effect on an s3:// source"):
        parse_spec({"model": {"name": "chat", "source": "s3://models/tiny", "revision": "v2"}})


def test_a_revision_beside_an_hf_sources_own_revision_is_refused_naming_both() -> None:
    # It would be overridden by @REVISION, silently: v1 would be fetched, not v2.
    with pytest.raises(SpecError, match=r"model.revision 'v2' .* hf:// source with @REVISION"):
        parse_spec({"model": {"name": "chat", "source": "hf://org/name@v1", "revision": "v2"}})


def test_a_cache_size_limit_beside_a_claim_is_refused_naming_both() -> None:
    # The sizeLimit sizes the emptyDir used without a claim: with one it bounds nothing.
    cache = {"claimName": "models", "sizeLimit": "4Gi"}
    with pytest.raises(SpecError, match=r"model.cache.sizeLimit '4Gi' .* model.cache.claimName"):
        parse_spec({"model": {"name": "chat", "source": "hf://org/name", "cache": cache}})
