"""The Client's public transport: `send` hands back any answer, `request`/`request_json`
and `stream` raise ApiError for anything but 2xx, and no transport error escapes."""

from __future__ import annotations

import httpx
import pytest

from aicluster.client import ApiError, Client, error_from


def answer(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/ok":
        return httpx.Response(200, json={"ok": True})
    if request.url.path == "/blob":
        return httpx.Response(200, content=b"x" * 10)
    if request.url.path == "/down":
        raise httpx.ConnectError("refused", request=request)
    return httpx.Response(404, json={"detail": {"message": "no such thing"}})


@pytest.fixture
def client():
    with Client("http://api.test", "tok", transport=httpx.MockTransport(answer)) as c:
        yield c


def test_request_json_returns_the_body_or_raises(client):
    assert client.request_json("GET", "/ok") == {"ok": True}
    with pytest.raises(ApiError) as exc:
        client.request_json("GET", "/missing")
    assert (exc.value.status_code, exc.value.message) == (404, "no such thing")


def test_send_hands_back_refusals(client):
    resp = client.send("GET", "/missing")
    assert resp.status_code == 404
    assert error_from(resp).message == "no such thing"


def test_stream_reads_as_it_arrives_and_raises_for_refusals(client):
    with client.stream("GET", "/blob") as resp:
        assert b"".join(resp.iter_bytes(4)) == b"x" * 10
    with pytest.raises(ApiError) as exc, client.stream("GET", "/missing"):
        pass
    assert exc.value.status_code == 404


@pytest.mark.parametrize("call", ["send", "request", "request_json", "stream"])
def test_an_unreachable_api_is_status_0(client, call):
    with pytest.raises(ApiError) as exc:
        if call == "stream":
            with client.stream("GET", "/down"):
                pass
        else:
            getattr(client, call)("GET", "/down")
    assert exc.value.status_code == 0 and "cannot reach" in exc.value.message
