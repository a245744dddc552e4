// Open-loop load on one model over HTTP (KServe v2 JSON) and gRPC at once, recording
// the version that answered each request, for scripts/bench/bench_updates.py (models
// changing under load).
//
//   .venv/bin/k6 run -e RATE=1000 -e DURATION=180s -e MODEL=desk \
//       --out csv=requests.csv loadtest/updates.js
//
// Env: TICKSERVE_HTTP (http://127.0.0.1:8000), TICKSERVE_GRPC (127.0.0.1:8001), MODEL
// (desk), FEATURES (16), RATE (requests per second, half on each protocol), DURATION.
// Each answer adds its version to the Trend `answered_version` (tagged `protocol`); a
// failed request counts in `failed` (tagged with its status).
import http from 'k6/http';
import grpc from 'k6/net/grpc';
import encoding from 'k6/encoding';
import { Counter, Trend } from 'k6/metrics';

const HTTP = __ENV.TICKSERVE_HTTP || 'http://127.0.0.1:8000';
const GRPC = __ENV.TICKSERVE_GRPC || '127.0.0.1:8001';
const MODEL = __ENV.MODEL || 'desk';
const FEATURES = parseInt(__ENV.FEATURES || '16', 10);
const RATE = parseInt(__ENV.RATE || '1000', 10);
const DURATION = __ENV.DURATION || '60s';

const version = new Trend('answered_version');
const failed = new Counter('failed');

const shape = { executor: 'constant-arrival-rate', rate: Math.max(1, RATE / 2), timeUnit: '1s',
  duration: DURATION, preAllocatedVUs: 64 };
export const options = {
  scenarios: {
    http: { ...shape, exec: 'overHttp' },
    grpc: { ...shape, exec: 'overGrpc' },
  },
  summaryTrendStats: ['avg', 'med', 'p(99)', 'max'],
};

const row = Array.from({ length: FEATURES }, (_, i) => i / FEATURES);
const body = JSON.stringify({
  inputs: [{ name: 'features', datatype: 'FP32', shape: [1, FEATURES], data: row }],
});
const params = { headers: { 'Content-Type': 'application/json' }, timeout: '2s' };

export function overHttp() {
  const r = http.post(`${HTTP}/v2/models/${MODEL}/infer`, body, params);
  if (r.status === 200) {
    version.add(parseInt(r.json('model_version'), 10), { protocol: 'http' });
  } else {
    failed.add(1, { protocol: 'http', status: String(r.status) });
  }
}

const client = new grpc.Client();
client.load(['../proto'], 'grpc_service.proto');
const request = {
  model_name: MODEL,
  inputs: [{ name: 'features', datatype: 'FP32', shape: [1, FEATURES] }],
  raw_input_contents: [encoding.b64encode(new Float32Array(row).buffer)],
};
let connected = false;

export function overGrpc() {
  if (!connected) {
    client.connect(GRPC, { plaintext: true });
    connected = true;
  }
  const r = client.invoke('inference.GRPCInferenceService/ModelInfer', request, { timeout: '2s' });
  if (r && r.status === grpc.StatusOK) {
    version.add(parseInt(r.message.modelVersion, 10), { protocol: 'grpc' });
  } else {
    failed.add(1, { protocol: 'grpc', status: String(r ? r.status : 'none') });
  }
}
