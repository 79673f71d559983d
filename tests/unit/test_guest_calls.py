"""A guest that stops answering is reported with what its console last said (the lab's own diagnostics)."""

from __future__ import annotations

import pytest

from lab.guest_calls import GuestTimeout, Pending


def test_no_reply_carries_the_consoles_tail() -> None:
    pending = Pending("uname -r", 0, lambda: "console:\nKernel panic - not syncing: Out of memory")
    with pytest.raises(GuestTimeout) as err:
        pending.wait(timeout=0.01)
    assert "no reply from the guest" in str(err.value) and "Kernel panic" in str(err.value)


def test_an_answer_is_returned_as_it_came() -> None:
    pending = Pending("true", 5)
    pending._box.put({"rc": 0, "out": "ok\n", "err": "", "t": 0.1})
    assert pending.check() == "ok\n"
