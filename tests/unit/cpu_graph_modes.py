"""The graph execution modes simulated on the CPU: `simulate(executor, mode, monkeypatch)` makes
an executor's capture its warm-up (buffers restored afterwards) and its captured parts plain
calls, so host_loop and device_loop run their programs' tensor code without CUDA graphs."""

from __future__ import annotations

from dlrt.runtime import executor as executor_module


class Replay:
    """A 'captured' part on the CPU: replaying it calls the function."""

    def __init__(self, fn):
        self.fn = fn

    def replay(self):
        self.fn()

    def launch(self):
        self.fn()

    def reset(self):
        pass

    close = reset


def simulate(executor, mode: str, monkeypatch) -> None:
    """Run `executor` in a graph mode on the CPU: capture is the executor's warm-up (its
    buffers restored afterwards) and the parts replay as calls; device_loop's WHILE graph
    runs begin, rounds while the flag is set, and end."""

    def capture(program, phase):
        begin = program.phases[phase]
        executor_module.warm_up(program, begin, [t.clone() for t in program.buffers()])
        if mode == "host_loop":
            return [Replay(begin), Replay(program.round), Replay(program.end)]

        def loop():
            begin()
            while program.state.flag.item():
                program.round()
            program.end()

        return Replay(loop)

    monkeypatch.setattr(executor, "mode", mode)
    monkeypatch.setattr(executor, "_capture", capture)
    monkeypatch.setattr(executor, "_free", lambda graphs: None)
