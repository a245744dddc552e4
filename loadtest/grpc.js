// tickserve over gRPC (inference.GRPCInferenceService/ModelInfer, raw input bytes),
// using the project's proto/: one-row predictions in the load shape SCENARIO (see
// lib/scenarios.js).
//
//   .venv/bin/k6 run -e SCENARIO=steady -e RATE=1000 loadtest/grpc.js
//
// Env: TICKSERVE_GRPC (127.0.0.1:8001), TIMEOUT (each call's deadline, sent as
// grpc-timeout: 1s) and those of lib/scenarios.js.
//
// Each call carries its own deadline, as a trading client's would. Without one, k6
// sends the scenario's end as the deadline for the last two minutes of a run, and
// those ever-changing grpc-timeout values churn the server's HPACK tables late in
// the run (docs/performance.md, "Soak").
import grpc from 'k6/net/grpc';
import encoding from 'k6/encoding';
import { Rate } from 'k6/metrics';
import * as shape from './lib/scenarios.js';

const ADDR = __ENV.TICKSERVE_GRPC || '127.0.0.1:8001';
const TIMEOUT = __ENV.TIMEOUT || '1s';
const client = new grpc.Client();
client.load(['../proto'], 'grpc_service.proto');
const errors = new Rate('errors');
const shed = new Rate('shed');
// k6's own per-call duration, at microsecond resolution.
export const options = shape.options('grpc_req_duration', 'errors');

const requests = {};
for (const name of shape.models) {
  const n = shape.width(name);
  const row = new Float32Array(n).map((_, i) => i / n);
  requests[name] = {
    model_name: name,
    inputs: [{ name: 'features', datatype: 'FP32', shape: [1, n] }],
    raw_input_contents: [encoding.b64encode(row.buffer)],
  };
}

let connected = false;

export default function () {
  if (!connected) {
    client.connect(ADDR, { plaintext: true });
    connected = true;
  }
  const r = client.invoke('inference.GRPCInferenceService/ModelInfer', requests[shape.model()], {
    timeout: TIMEOUT,
  });
  const ok = r && r.status === grpc.StatusOK;
  const exhausted = r && r.status === grpc.StatusResourceExhausted;
  shed.add(exhausted);
  errors.add(!ok && !exhausted);
}
