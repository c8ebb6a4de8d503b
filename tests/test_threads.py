"""Compilation from several threads gives what one thread gives (issue: FakeTensorMode shared
across threads failed every run; the first discover() raced)."""

from __future__ import annotations

import subprocess
import sys
import threading

import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug

THREADS = 4


def _train_one(seed: int, results: dict, errors: list) -> None:
    try:
        torch.manual_seed(seed)
        a, b = torch.randn(4, 3), torch.randn(4, 3)
        w = torch.randn(3, 3, requires_grad=True)

        def fn(x, w):
            return ((x @ w).sin() * 2).sum()

        jitted = thunder.jit(fn, executors=thunderplug.discover(quiet=True))
        losses, grads = [], []
        for step in range(3):
            x = TwoTensor(a + step, b - step)
            loss = jitted(x, w)
            (grad,) = torch.autograd.grad(loss, (w,))
            losses.append(loss)
            grads.append(grad)
        expected = []
        for step in range(3):
            x = TwoTensor(a + step, b - step)
            loss = fn(x, w)
            expected.append((loss, torch.autograd.grad(loss, (w,))[0]))
        results[seed] = (losses, grads, expected)
    except BaseException as error:  # noqa: BLE001 - reported by the main thread
        errors.append(error)


def test_four_threads_compile_and_train_a_subclass_function():
    results: dict = {}
    errors: list = []
    threads = [threading.Thread(target=_train_one, args=(seed, results, errors)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    assert sorted(results) == list(range(THREADS))
    for losses, grads, expected in results.values():
        for loss, grad, (want_loss, want_grad) in zip(losses, grads, expected):
            assert type(loss) is TwoTensor and type(grad) is type(want_grad)
            torch.testing.assert_close(loss, want_loss)
            torch.testing.assert_close(grad, want_grad)


RACE = """
import threading, thunderplug
names, barrier = [], threading.Barrier(4)
def first():
    barrier.wait()
    names.append(tuple(e.name for e in thunderplug.discover(quiet=True)))
threads = [threading.Thread(target=first) for _ in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
print(len(set(names)), names[0])
"""


def test_the_first_discover_from_four_threads_gives_one_list():
    race = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=300)
    single = subprocess.run(
        [sys.executable, "-c", "import thunderplug; print(1, tuple(e.name for e in thunderplug.discover(quiet=True)))"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert race.returncode == 0 and single.returncode == 0, race.stderr + single.stderr
    assert race.stdout.split()[0] == "1"
    assert race.stdout.strip().split(" ", 1)[1] == single.stdout.strip().split(" ", 1)[1]


def test_autocast_rules_stay_on_after_compilations_interleave_in_two_threads():
    """thunder turns its autocast rules off around each rule (and thunderplug around each unrolled
    subclass graph) with a process-wide flag saved and restored: threads that interleave (A off, B
    saves "off", A restores "on", B restores "off") left it off, and every later compilation under
    ``torch.autocast`` came out float32 (it failed the autocast tests of a whole-suite run). With
    thunderplug's patches the flag is per thread; the interleaving is forced here."""
    import thunder.transforms.autocast as thunder_autocast

    thunderplug.discover(quiet=True)  # installs the patches
    a_entered, b_entered, a_left = threading.Event(), threading.Event(), threading.Event()

    def first():
        with thunder_autocast.disable_autocast():
            a_entered.set()
            b_entered.wait(10)
        a_left.set()

    def second():
        a_entered.wait(10)
        with thunder_autocast.disable_autocast():
            b_entered.set()
            a_left.wait(10)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert thunder_autocast.is_autocast_enabled()

    def linear(x, w):
        return torch.nn.functional.linear(x, w)

    x, w = torch.randn(4, 8), torch.randn(3, 8)
    for jitted in (thunder.jit(linear), thunder.jit(linear, executors=thunderplug.discover(quiet=True))):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected, actual = linear(x, w), jitted(x, w)
        assert actual.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(actual, expected)
