// Load shapes shared by http.js and grpc.js, picked with -e SCENARIO=...
//
//   closed  VUS virtual users, each sending its next request when the last is
//           answered (perf_analyzer's --concurrency-range model)
//   steady  RATE requests per second, open loop (constant-arrival-rate)
//   ramp    from RATE/10 up to MAX_RATE requests per second over DURATION: find the knee
//   spike   RATE, then 4 × RATE for a fifth of DURATION, then RATE again
//   family  RATE requests per second spread over the FAMILY_SIZE tick_NNN models of one
//           family (tick_000 … tick_007 in config/models; the family benchmark makes more)
//
// Env: SCENARIO (steady), RATE (1000), MAX_RATE (8000), DURATION (30s), VUS (1),
// FAMILY_SIZE (8).
// Thresholds: p(99) under 2 ms for answered requests, under 0.1% errors (steady,
// closed, family); ramp and spike look for the limits, so they only record.

const scenario = __ENV.SCENARIO || 'steady';
const rate = parseInt(__ENV.RATE || '1000', 10);
const maxRate = parseInt(__ENV.MAX_RATE || '8000', 10);
const duration = __ENV.DURATION || '30s';
const seconds = parseInt(duration, 10);
const preAllocatedVUs = parseInt(__ENV.PREALLOCATED_VUS || '64', 10);

const shapes = {
  closed: { executor: 'constant-vus', vus: parseInt(__ENV.VUS || '1', 10), duration },
  steady: { executor: 'constant-arrival-rate', rate, timeUnit: '1s', duration, preAllocatedVUs },
  family: { executor: 'constant-arrival-rate', rate, timeUnit: '1s', duration, preAllocatedVUs },
  ramp: {
    executor: 'ramping-arrival-rate', startRate: Math.max(1, Math.floor(rate / 10)), timeUnit: '1s',
    preAllocatedVUs, stages: [{ target: maxRate, duration }],
  },
  spike: {
    executor: 'ramping-arrival-rate', startRate: rate, timeUnit: '1s', preAllocatedVUs,
    stages: [
      { target: rate, duration: `${Math.round(seconds * 0.4)}s` },
      { target: 4 * rate, duration: '1s' },
      { target: 4 * rate, duration: `${Math.round(seconds * 0.2)}s` },
      { target: rate, duration: '1s' },
      { target: rate, duration: `${Math.round(seconds * 0.4)}s` },
    ],
  },
};

if (!shapes[scenario]) {
  throw new Error(`unknown SCENARIO '${scenario}': one of ${Object.keys(shapes).join(', ')}`);
}

/// The k6 options for the chosen scenario; `latency` is the Trend of answered requests.
export function options(latency, errors) {
  const gated = ['closed', 'steady', 'family'].includes(scenario);
  return {
    scenarios: { [scenario]: shapes[scenario] },
    thresholds: gated
      ? { [latency]: ['p(99)<2'], [errors]: ['rate<0.001'] }
      : { [latency]: ['p(99)<1000000'] },
    summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
  };
}

const familySize = parseInt(__ENV.FAMILY_SIZE || '8', 10);

/// Every model a run may ask for.
export const models = ['alpha_mlp'].concat(
  Array.from({ length: familySize }, (_, i) => `tick_${String(i).padStart(3, '0')}`));

/// The model for the next request: alpha_mlp, or one of the family for `family`.
export function model() {
  return scenario === 'family' ? models[1 + Math.floor(Math.random() * familySize)] : 'alpha_mlp';
}

/// Features of one row for `name`.
export function width(name) {
  return name === 'alpha_mlp' ? 50 : 16;
}
