"""Arguments the SDK checks itself, before any call: these need no daemon (the
client's state dir is an empty temporary one, so a call that got through would be
berth.Unavailable, not berth.Invalid)."""

import pytest

import berth

BAD_TIMEOUTS = ["30", b"30", True, False, 0, 0.0, -1, -0.5, float("nan"), float("inf"), float("-inf"), 1e12, 10**400, [1], object()]


@pytest.fixture
def client(tmp_path):
    return berth.Client(state_dir=str(tmp_path))


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_client_timeout_checked(tmp_path, bad):
    with pytest.raises(berth.Invalid) as e:
        berth.Client(state_dir=str(tmp_path), timeout=bad)
    m = e.value.message
    assert "timeout=%r" % (bad,) in m and "seconds above 0" in m and "None" in m, m
    assert e.value.kind == "invalid" and e.value.status == 0


@pytest.mark.parametrize("good", [None, 1, 2.5, 0.001, 10**9])
def test_client_timeout_taken(tmp_path, good):
    assert berth.Client(state_dir=str(tmp_path), timeout=good).timeout == good


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_call_timeout_checked(client, bad):
    s = client.session("l:1")
    calls = [
        lambda: s.exec(["true"], timeout=bad),
        lambda: s.shell("true", timeout=bad),
        lambda: s.stream(["true"], timeout=bad),
        lambda: s.stream(shell="true", timeout=bad),
    ]
    for call in calls:
        with pytest.raises(berth.Invalid) as e:
            call()
        m = e.value.message
        assert "timeout=%r" % (bad,) in m and "seconds above 0" in m, m
        assert e.value.session == "l:1"


@pytest.mark.parametrize("name", ["", None, 5])
def test_session_name_checked(client, name):
    with pytest.raises(berth.Invalid) as e:
        client.session(name)
    m = e.value.message
    assert m.startswith("session name %r: " % (name,)), m
    assert ("is empty" if name == "" else "not str") in m, m
    # the daemon's rule (config/names.go), with an example
    assert "1 to 128 characters" in m and "non-ASCII" in m and '"chat:1"' in m, m
