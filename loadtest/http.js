// tickserve over HTTP/JSON (KServe v2): one-row predictions in the load shape
// SCENARIO (see lib/scenarios.js).
//
//   .venv/bin/k6 run -e SCENARIO=steady -e RATE=1000 loadtest/http.js
//
// Env: TICKSERVE_HTTP (http://127.0.0.1:8000) and those of lib/scenarios.js.
import http from 'k6/http';
import { Rate, Trend } from 'k6/metrics';
import * as shape from './lib/scenarios.js';

const BASE = __ENV.TICKSERVE_HTTP || 'http://127.0.0.1:8000';
const answered = new Trend('answered_duration', true);
const errors = new Rate('errors');
const shed = new Rate('shed');
export const options = shape.options('answered_duration', 'errors');

const bodies = {};
for (const name of shape.models) {
  const n = shape.width(name);
  bodies[name] = JSON.stringify({
    inputs: [{ name: 'features', datatype: 'FP32', shape: [1, n], data: Array.from({ length: n }, (_, i) => i / n) }],
  });
}
const params = { headers: { 'Content-Type': 'application/json' }, responseCallback: http.expectedStatuses(200, 429) };

export default function () {
  const name = shape.model();
  const r = http.post(`${BASE}/v2/models/${name}/infer`, bodies[name], params);
  if (r.status === 200) answered.add(r.timings.duration);
  shed.add(r.status === 429);
  errors.add(r.status !== 200 && r.status !== 429);
}
