"""The builtin engine end to end: the char-lm example job trains a model through the
platform, a service serves it, and the official openai client talks to it (and to
the embedding model) through the gateway: sync, async and streaming."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import httpx
import openai
import pytest

from aicluster.client.api import pack_workdir

from harness import wait_for

pytest.importorskip("torch", reason="the builtin engine needs the torch extra")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "char-lm"


def deploy(cp, spec: dict) -> None:
    r = httpx.post(
        cp.url + "/v1/services",
        json={"spec": spec},
        headers={"Authorization": f"Bearer {cp.admin_token}"},
    )
    assert r.status_code == 201, r.text


def ready(cp, name: str) -> int:
    r = httpx.get(
        f"{cp.url}/v1/services/{name}", headers={"Authorization": f"Bearer {cp.admin_token}"}
    )
    return r.json()["ready"]


@pytest.fixture(scope="module")
def builtin_services(control_plane, admin):
    # The example job trains the model and publishes it as an artifact ...
    job = admin.submit(
        {
            "kind": "job",
            "name": "char-lm",
            "working_dir": ".",
            "resources": {"cpus": 1},
            "command": "python train.py --steps 60 --out model",
            "outputs": [{"path": "model", "artifact": "default/char-lm"}],
        },
        pack_workdir(EXAMPLE),
    )
    done = admin.wait(job["id"], {"SUCCEEDED", "FAILED"}, timeout=240)
    assert done["status"] == "SUCCEEDED", admin.logs(job["id"])[0][-2000:]
    assert "produced default/char-lm:" in done["message"]
    base = {
        "kind": "service",
        "engine": "builtin",
        "resources": {"cpus": 0.5},
        "readiness_timeout_s": 240,
    }
    # ... which a service serves, materialised on each replica's node.
    deploy(
        control_plane,
        {
            **base,
            "name": "tiny-lm",
            "model": "artifact:default/char-lm:latest",
            "replicas": {"min": 2, "max": 2},
        },
    )
    deploy(
        control_plane,
        {**base, "name": "minilm", "model": "all-minilm-l6-v2", "replicas": {"min": 1, "max": 1}},
    )
    wait_for(
        lambda: ready(control_plane, "tiny-lm") == 2 and ready(control_plane, "minilm") == 1,
        timeout=300,
        interval=0.5,
        what="builtin replicas",
    )
    yield openai.OpenAI(base_url=control_plane.url + "/v1", api_key=control_plane.admin_token)
    for name in ("tiny-lm", "minilm"):
        httpx.delete(
            f"{control_plane.url}/v1/services/{name}",
            headers={"Authorization": f"Bearer {control_plane.admin_token}"},
        )


def test_sync_completion_and_chat(builtin_services):
    client = builtin_services
    out = client.completions.create(model="tiny-lm", prompt="The keeper", max_tokens=12)
    assert len(out.choices[0].text) > 0 and out.usage.completion_tokens > 0
    chat = client.chat.completions.create(
        model="tiny-lm",
        messages=[{"role": "user", "content": "Tell me of the sea"}],
        max_tokens=16,
    )
    assert chat.choices[0].message.content


def test_async_and_streaming_chat(control_plane, builtin_services):
    async def run():
        client = openai.AsyncOpenAI(
            base_url=control_plane.url + "/v1", api_key=control_plane.admin_token
        )
        replies = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="tiny-lm", max_tokens=8, messages=[{"role": "user", "content": f"hi {i}"}]
                )
                for i in range(4)
            )
        )
        stream = await client.chat.completions.create(
            model="tiny-lm",
            messages=[{"role": "user", "content": "stream"}],
            max_tokens=24,
            stream=True,
        )
        chunks = [c.choices[0].delta.content async for c in stream if c.choices]
        return replies, chunks

    replies, chunks = asyncio.run(run())
    assert all(r.choices[0].message.content for r in replies)
    assert len([c for c in chunks if c]) >= 5, "tokens arrive as separate chunks"


def test_embeddings_through_the_gateway(builtin_services):
    out = builtin_services.embeddings.create(
        model="minilm",
        input=[
            "A cat sits on the mat.",
            "A kitten rests on a rug.",
            "Quarterly tax filing deadlines.",
        ],
    )
    vecs = [d.embedding for d in out.data]
    assert [len(v) for v in vecs] == [384, 384, 384]

    def cos(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(
            sum(x * x for x in a) * sum(y * y for y in b)
        )

    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2])
    with pytest.raises(openai.BadRequestError):
        builtin_services.completions.create(model="minilm", prompt="x", max_tokens=1)


def test_unknown_model_artifact_is_refused_at_deploy(control_plane):
    r = httpx.post(
        control_plane.url + "/v1/services",
        headers={"Authorization": f"Bearer {control_plane.admin_token}"},
        json={
            "spec": {
                "kind": "service",
                "name": "ghost",
                "engine": "builtin",
                "model": "artifact:default/no-such-model:9",
            }
        },
    )
    assert r.status_code == 422
    assert r.json()["detail"]["issues"][0]["field"] == "model"
