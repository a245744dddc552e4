// Single-row alpha_mlp over HTTP/JSON (KServe v2), closed loop: VUS virtual users, each
// sending its next request when the last is answered (the same model of load as
// perf_analyzer's --concurrency-range).
//
//   .venv/bin/k6 run -e VUS=1 -e DURATION=20s loadtest/alpha_mlp_http.js
//
// Env: TICKSERVE_HTTP (default http://127.0.0.1:8000), VUS (1), DURATION (20s).
import http from 'k6/http';
import { check } from 'k6';

const BASE = __ENV.TICKSERVE_HTTP || 'http://127.0.0.1:8000';

export const options = {
  scenarios: {
    single_row: {
      executor: 'constant-vus',
      vus: parseInt(__ENV.VUS || '1', 10),
      duration: __ENV.DURATION || '20s',
    },
  },
  thresholds: {
    http_req_failed: ['rate<0.001'],
    http_req_duration: ['p(99)<2'], // milliseconds
  },
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
};

const body = JSON.stringify({
  inputs: [{
    name: 'features', datatype: 'FP32', shape: [1, 50],
    data: Array.from({ length: 50 }, (_, i) => i / 50),
  }],
});
const params = { headers: { 'Content-Type': 'application/json' } };

export default function () {
  const r = http.post(`${BASE}/v2/models/alpha_mlp/infer`, body, params);
  check(r, { 'status 200': (res) => res.status === 200 });
}
