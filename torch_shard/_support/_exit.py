"""Leaving the interpreter with no gloo worker thread left to need it (NOTE [ Exit after gloo ]).

NOTE [ Exit after gloo ]
A job that ran to its last line could still die at exit with "terminate called without an active
exception" (SIGABRT), failing under torchrun: 1 launch in 3 to 10 of ``examples/gpu_smoke.py --device
cpu`` on 4 ranks here. A core dump shows where: a gloo worker thread (``ProcessGroupGloo::runLoop``)
destroys a finished ``AsyncBarrierWork``; the barrier held a reference to the collective before it (an
``all_gather_object``'s ``AsyncAllgatherWork``, snapshotted while its worker had not yet let go of it),
whose output tensors were made in Python; freeing their Python objects needs the GIL; the main thread
had meanwhile returned from the barrier, destroyed the group and begun finalizing the interpreter, so
``take_gil`` ends the worker thread with ``pthread_exit``, whose forced unwinding through the (noexcept)
destructor calls ``std::terminate``.

A destroyed group's backend joins its worker threads when its last reference goes, with the GIL
released (torch's no-GIL holder), which is safe while the interpreter is alive. The group lived into
finalization because objects in reference cycles still held it: a ShardedTensor or DTensor in a frame
kept by a caught exception's traceback (every "raises on every rank" path makes one, and so does a
user's ``except``), freed only by the collection that finalization runs, after it is too late.

So torch_shard collects cycles once more when the interpreter starts to exit (``atexit`` handlers run
before finalization begins): groups that were destroyed and are held only by garbage die then, their
worker threads finish their work with the GIL still available, and finalization finds nothing left to
race with. It costs one garbage collection at exit, which finalization would run anyway. A group that is
never destroyed (``destroy_process_group`` not called) or that live objects still hold is outside what
this can fix: destroy the group and drop its tensors before exiting.
"""

from __future__ import annotations

import atexit
import gc


def _collect_before_finalization() -> None:
    gc.collect()


atexit.register(_collect_before_finalization)
