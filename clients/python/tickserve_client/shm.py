"""The shared-memory client (iceoryx2 request-response of byte slices)."""
import ctypes
import itertools
import os
import time

import iceoryx2 as iox2

from . import protocol

U8 = iox2.Slice[ctypes.c_uint8]
LIVENESS_CHECK_S = 0.1


class _Connection:
    def __init__(self, service):
        self.node = (iox2.NodeBuilder.new()
                     .signal_handling_mode(iox2.SignalHandlingMode.Disabled)
                     .create(iox2.ServiceType.Ipc))
        try:
            self.requests = (self.node.service_builder(iox2.ServiceName.new(f"{service}/infer"))
                             .request_response(U8, U8).open())
            wake = self.node.service_builder(iox2.ServiceName.new(f"{service}/wake")).event().open()
        except Exception as e:  # iceoryx2 raises its own types
            if "ExceedsMaxNumberOfNodes" in f"{e!r} {e}":
                # The service is there and full: every client is a node, and the
                # server takes a bounded number (the Rust client says the same).
                raise ConnectionError(f"the tickserve server on {service!r} takes no more "
                                      f"clients (each client is a node): {e}") from e
            raise ConnectionError(f"no tickserve server serves {service!r} "
                                  f"(is [shm] enabled, and this process the server's user?): {e}")
        if self.requests.dynamic_config.number_of_servers == 0:
            raise ConnectionError(f"the service {service}/infer has no server")
        self.client = (self.requests.client_builder().initial_max_slice_len(1024)
                       .allocation_strategy(iox2.AllocationStrategy.PowerOfTwo).create())
        self.notifier = wake.notifier_builder().create()
        self.wake = wake


class ShmClient:
    """Inference over shared memory: `infer(model, {"input": array}) -> {"output": array}`.

    One client per thread. `timeout` (seconds) bounds each call; the server also gets it as
    the request's deadline. `spin` (seconds): how long a call polls for its answer without
    pause before it yields its core between polls (`os.sched_yield`); None (the default)
    polls for the whole call, as a client on a core of its own does (pin it with
    `os.sched_setaffinity`); 0 lets other threads on the same cores run while it waits."""

    def __init__(self, service="tickserve", timeout=5.0, spin=None):
        self.service = service
        self.timeout = timeout
        self.spin = spin
        self._connection = _Connection(service)
        self._models = {}
        self._ids = itertools.count(1)

    def infer(self, model, inputs, parameters=None):
        """Runs `model` on `inputs` (a dict of name to numpy array); `parameters`: a dict of
        v2 request parameters (`priority`, `sequence_id`, `sequence_start`, `sequence_end`,
        `mc_samples`, ...). Returns a dict of name to numpy array."""
        cached = model in self._models
        try:
            return self._infer_once(model, inputs, parameters)
        except protocol.ServerError as e:
            # A handle from before the server restarted: look the model up again and send
            # once more (the request never ran).
            if cached and e.code == "NOT_FOUND" and "stale model handle" in e.message:
                return self._infer_once(model, inputs, parameters)
            raise

    def _infer_once(self, model, inputs, parameters):
        handle = self._models.get(model)
        if handle is None:
            kind, handle, _, _ = protocol.read_answer(
                self._call(protocol.lookup_request(next(self._ids), model)))
            self._models[model] = handle
        request = protocol.infer_request(
            next(self._ids), handle, min(int(self.timeout * 1e6), 2**32 - 1),
            [(name.encode(), array) for name, array in inputs.items()], parameters)
        try:
            return protocol.read_answer(self._call(request))[1]
        except protocol.ServerError as e:
            if e.code == "NOT_FOUND":
                self._models.pop(model, None)  # the server may have restarted
            raise

    def _call(self, request):
        if self._connection is None:
            self._connection = _Connection(self.service)
            self._models.clear()
        try:
            return self._exchange(request)
        except ConnectionError:
            self._connection = None
            self._models.clear()
            raise

    def _exchange(self, request):
        c = self._connection
        sample = c.client.loan_slice_uninit(len(request))
        ctypes.memmove(sample.payload_ptr, request, len(request))
        pending = sample.assume_init().send()
        c.notifier.notify()
        started = checked = time.monotonic()
        while True:
            response = pending.receive()
            if response is not None:
                return bytes(response.payload().as_memory_view())
            now = time.monotonic()
            if self.spin is not None and now - started >= self.spin:
                os.sched_yield()
            if now - started >= self.timeout:
                raise TimeoutError(f"no answer from tickserve within {self.timeout} s")
            if now - checked >= LIVENESS_CHECK_S:
                checked = now
                c.node.try_cleanup_dead_nodes()
                if not pending.is_connected:
                    # The server lets a request go once it has answered: an
                    # answer that came since the last look is still here.
                    response = pending.receive()
                    if response is not None:
                        return bytes(response.payload().as_memory_view())
                    raise ConnectionError("the tickserve server went away while the request "
                                          "was in flight")
