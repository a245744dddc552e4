//! The shared-memory front end: clients on the same host send requests
//! through iceoryx2 shared memory (docs/shm.md), in the fixed layout of
//! [`tickserve_shm_protocol`], and get the same models, validation,
//! batching, deadlines, limits and metrics (`protocol="shm"`) as over HTTP
//! and gRPC.
//!
//! Services, under `shm.service` (default `tickserve`): `SERVICE/infer`, a
//! request-response service of byte slices, and `SERVICE/wake`, an event
//! clients notify after each request so that a sleeping front-end thread
//! wakes. Each of `shm.threads` threads takes requests from the one server
//! port, in rounds (every request waiting, answered in turn, then the next
//! round: see [`rounds`]); after a request it keeps polling for `shm.spin`,
//! then sleeps on the event (waking at least every [`TICK`] to clean up
//! after clients that died). In the latency mode (`[latency]`) the spin is
//! for ever: the thread, pinned to its core, never sleeps, and with
//! `latency.warm` it reruns the last model it served while idle.
//!
//! A request runs on the thread that took it when it can finish there (the
//! run-at-once path: an idle executor, nothing queued): the future is polled
//! once, in place. Otherwise it moves to the async runtime and answers from
//! there when the executor does. Lookups turn a model name into a handle
//! (a 64-bit token this process drew at random for the model's name and
//! version, so a handle survives a reload of its model, and a client can
//! neither guess another's nor use one from before a restart).
//!
//! The request is copied out of the client's sample before it is parsed: the
//! sample stays writable by the client while the server reads it. Each
//! thread is supervised: a panic is counted
//! (`tickserve_shm_thread_panics_total`), the server reports not ready while
//! the thread is down, and the thread starts again after a back-off.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use iceoryx2::prelude::*;
use tickserve_core::config::ShmConfig;
use tickserve_core::{DataType, Error, InferResponse, InputTensor, TensorSpec, durations};
use tickserve_runtime::ModelHandle;
use tickserve_runtime::gather::Round;
use tickserve_shm_protocol as wire;

use crate::transport::status;
use tickserve_edge::observe::Protocol;
use tickserve_edge::params::{Param, Parameters};
use tickserve_edge::{Call, Decoded, Edge, Payload, RequestBytes};

mod rounds;

use rounds::Rounds;

/// How often a sleeping front-end thread wakes to clean up after dead clients.
pub const TICK: Duration = Duration::from_millis(100);

/// The most distinct models (name and version) clients may look up.
pub const MAX_HANDLES: usize = 4096;

/// The start of the message for a handle this server did not give out.
pub const STALE_HANDLE: &str = "unknown or stale model handle";

/// The handles given out: each model name and version (canonical: as the
/// model answers it, so `1`, `01` and `+1` are one) has one random 64-bit
/// token.
struct Handles {
    keys: Vec<(String, String)>,
    by_key: HashMap<(String, String), u64>,
    by_token: HashMap<u64, usize>,
    /// Keyed by the process's random state: tokens nobody outside can
    /// predict, different from any earlier run's.
    tokens: RandomState,
}

impl Handles {
    fn new() -> Handles {
        Handles {
            keys: Vec::new(),
            by_key: HashMap::new(),
            by_token: HashMap::new(),
            tokens: RandomState::new(),
        }
    }

    /// The token of (`name`, `version`), made on its first lookup; `None`
    /// once [`MAX_HANDLES`] are out.
    fn token(&mut self, name: &str, version: &str) -> Option<u64> {
        let key = (name.to_string(), version.to_string());
        if let Some(&token) = self.by_key.get(&key) {
            return Some(token);
        }
        if self.keys.len() >= MAX_HANDLES {
            return None;
        }
        let index = self.keys.len();
        // A fresh token for a fresh index; a (vanishingly rare) collision
        // draws again.
        let mut salt = 0u64;
        let token = loop {
            let token = self.tokens.hash_one((index, salt));
            if token != 0 && !self.by_token.contains_key(&token) {
                break token;
            }
            salt += 1;
        };
        self.keys.push(key.clone());
        self.by_key.insert(key, token);
        self.by_token.insert(token, index);
        Some(token)
    }

    /// The model name and version of `token`, if this process gave it out.
    fn resolve(&self, token: u64) -> Option<(String, String)> {
        self.by_token
            .get(&token)
            .and_then(|&i| self.keys.get(i))
            .cloned()
    }
}

/// The version a handle is kept under: empty for "the default version" (it
/// follows the default as models load), else the version as the model
/// answers to it (`01` and `+1` are `1`).
fn canonical_version<'a>(asked: &str, resolved: &'a str) -> &'a str {
    if asked.is_empty() { "" } else { resolved }
}

/// The most requests one client may have in flight.
pub const MAX_REQUESTS_PER_CLIENT: usize = 8;

/// The most clients connected at once. (iceoryx2 sizes its shared memory
/// for clients × requests in flight up front: these bounds are what memory
/// the front end maps.) Each client is a node of its own with a notifier on
/// the wake-up event: both services take this many nodes besides the
/// server's, and the event this many notifiers.
pub const MAX_CLIENTS: usize = 32;

type Service = ipc_threadsafe::Service;
type RequestService =
    iceoryx2::service::port_factory::request_response::PortFactory<Service, [u8], (), [u8], ()>;
type WakeService = iceoryx2::service::port_factory::event::PortFactory<Service>;
type ShmServer = iceoryx2::port::server::Server<Service, [u8], (), [u8], ()>;
type ActiveRequest = iceoryx2::active_request::ActiveRequest<Service, [u8], (), [u8], ()>;

/// The running front end; [`ShmFrontEnd::stop`] ends it.
pub struct ShmFrontEnd {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl ShmFrontEnd {
    /// Creates the services and starts `config.threads` threads serving them
    /// with `edge`'s runtime; async work goes to `runtime`. `warm`
    /// (`latency.warm`; zero: never): a thread with no request for that long
    /// runs the last model it served once more, on its own core.
    pub fn start(
        config: &ShmConfig,
        warm: Duration,
        edge: Arc<Edge>,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<ShmFrontEnd> {
        let node = NodeBuilder::new()
            .name(&"tickserve".try_into().context("iceoryx2 node name")?)
            .signal_handling_mode(SignalHandlingMode::Disabled)
            .create::<Service>()
            .context("cannot create the iceoryx2 node (shared memory)")?;
        let infer_name = format!("{}/infer", config.service);
        let service = node
            .service_builder(&infer_name.as_str().try_into().context("shm.service")?)
            .request_response::<[u8], [u8]>()
            .max_clients(MAX_CLIENTS)
            .max_nodes(MAX_CLIENTS + 1)
            .max_servers(1)
            .max_active_requests_per_client(MAX_REQUESTS_PER_CLIENT)
            .max_loaned_requests(2)
            .max_response_buffer_size(2)
            .open_or_create()
            .with_context(|| format!("cannot create the iceoryx2 service {infer_name}"))?;
        let server = service
            .server_builder()
            // One segment of `max_answer_bytes` slices. A segment that grows
            // (PowerOfTwo) gives each client connection used-chunk lists for
            // 255 possible segments, and the server scans them all when a
            // client leaves: 70 ms during which no client was answered.
            .initial_max_slice_len(config.max_answer_bytes)
            .allocation_strategy(AllocationStrategy::Static)
            .create()
            .with_context(|| {
                format!("cannot serve {infer_name} (is another tickserve serving it?)")
            })?;
        let wake_name = format!("{}/wake", config.service);
        let wake = node
            .service_builder(&wake_name.as_str().try_into().context("shm.service")?)
            .event()
            .max_nodes(MAX_CLIENTS + 1)
            .max_notifiers(MAX_CLIENTS)
            .open_or_create()
            .with_context(|| format!("cannot create the iceoryx2 event {wake_name}"))?;
        let listener = wake
            .listener_builder()
            .create()
            .context("cannot listen for client wake-ups")?;
        let context = Arc::new(Context_ {
            node,
            server,
            listener,
            edge,
            runtime,
            handles: Mutex::new(Handles::new()),
            spin: config.spin,
            warm: (!warm.is_zero()).then_some(warm),
            max_answer_bytes: config.max_answer_bytes,
            gather: config.gather,
            _services: (service, wake),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(config.threads);
        let (warmed, warm) = std::sync::mpsc::channel();
        for index in 0..config.threads {
            let context = Arc::clone(&context);
            let stop = Arc::clone(&stop);
            let warmed = warmed.clone();
            let cpu = (!config.cpus.is_empty()).then(|| config.cpus[index % config.cpus.len()]);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("shm-{index}"))
                    .spawn(move || {
                        if let Some(cpu) = cpu {
                            tickserve_runtime::pin_current_thread(cpu);
                        }
                        // A request runs at once on this thread: it runs
                        // each model once before the server is ready.
                        context.edge.runtime.warm_here();
                        let _ = warmed.send(());
                        drop(warmed);
                        supervise(index, &context, &stop);
                    })
                    .context("cannot start a shared-memory thread")?,
            );
        }
        drop(warmed);
        // Until every thread has warmed and let its sender go (or died).
        while warm.recv().is_ok() {}
        tracing::info!(service = %config.service, threads = config.threads, spin = ?config.spin,
            "shared-memory front end ready");
        Ok(ShmFrontEnd { stop, threads })
    }

    /// Stops taking requests and waits for the threads (requests already
    /// handed to the async runtime are still answered).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// What every front-end thread shares.
struct Context_ {
    node: Node<Service>,
    server: ShmServer,
    listener: iceoryx2::port::listener::Listener<Service>,
    edge: Arc<Edge>,
    runtime: tokio::runtime::Handle,
    /// The handles given out.
    handles: Mutex<Handles>,
    spin: Duration,
    /// `latency.warm`, when set.
    warm: Option<Duration>,
    /// `shm.max_answer_bytes`.
    max_answer_bytes: usize,
    /// `shm.gather`.
    gather: bool,
    /// Kept open while serving.
    _services: (RequestService, WakeService),
}

impl Context_ {
    /// The model name and version behind a handle this process gave out.
    fn resolve(&self, handle: u64) -> Option<(String, String)> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resolve(handle)
    }
}

/// The first wait before a thread that panicked starts again; it doubles
/// with each panic in a row, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// The longest wait before a thread that keeps panicking starts again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Runs thread `index`'s loop until `stop`; a panic is counted and logged,
/// the server reports not ready while the thread is down, and the loop
/// starts again after a back-off (a panic a minute after the last starts
/// the back-off afresh).
#[allow(clippy::disallowed_methods)] // the restart back-off is the machine's time
fn supervise(index: usize, context: &Context_, stop: &AtomicBool) {
    let mut backoff = FIRST_BACKOFF;
    let mut last_panic: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(context, stop)));
        let Err(panic) = run else {
            return;
        };
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        metrics::counter!(tickserve_core::metrics::SHM_THREAD_PANICS, "thread" => index.to_string())
            .increment(1);
        if last_panic.is_some_and(|t| t.elapsed() > Duration::from_secs(60)) {
            backoff = FIRST_BACKOFF;
        }
        last_panic = Some(Instant::now());
        tracing::error!(thread = index, panic = %what, backoff = ?backoff,
            "a shared-memory thread panicked; it starts again after the back-off");
        context.edge.thread_down();
        let until = Instant::now() + backoff;
        while Instant::now() < until && !stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(10));
        }
        context.edge.thread_up();
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A front-end thread's loop.
#[allow(clippy::disallowed_methods)] // the spin and the idle clean-up are the machine's time
fn serve(context: &Context_, stop: &AtomicBool) {
    // Futures polled here may set timers (a sequence's turn, say).
    let _entered = context.runtime.enter();
    let mut last_request = Instant::now();
    let mut last_cleanup = Instant::now();
    let mut rounds = Rounds::new(MAX_CLIENTS * MAX_REQUESTS_PER_CLIENT);
    // A round's requests whose answers wait for its gathered runs.
    let mut unfinished: Vec<Unfinished> = Vec::with_capacity(MAX_CLIENTS * MAX_REQUESTS_PER_CLIENT);
    // The round being gathered, from its first request to its last.
    let mut round: Option<Round> = None;
    // The handle of the last model this thread ran, and when it last ran
    // anything (a request or a warm run): `latency.warm`.
    let mut last_model: Option<u64> = None;
    let mut last_run = Instant::now();
    let warm_runs = metrics::counter!(tickserve_core::metrics::SHM_WARM_RUNS,
        "thread" => std::thread::current().name().unwrap_or("shm").to_string());
    while !stop.load(Ordering::Acquire) {
        let mut served = false;
        loop {
            if rounds.left() == 0 {
                crate::faults::shm_round();
            }
            let next = rounds.next(|| context.server.receive());
            match next {
                Ok(Some(active)) => {
                    served = true;
                    // The first of a round of several: its requests gather.
                    if context.gather && round.is_none() && rounds.left() > 0 {
                        round = Some(Round::new());
                    }
                    let gathering = round.as_ref().map(|r| (r, &mut unfinished));
                    if let Some(model) = handle(context, active, gathering) {
                        last_model = Some(model);
                    }
                    if rounds.left() == 0
                        && let Some(round) = round.take()
                    {
                        finish_round(context, &round, &mut unfinished);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = ?e, "shared-memory receive failed");
                    break;
                }
            }
        }
        let now = Instant::now();
        if served {
            last_request = now;
            last_run = now;
            continue;
        }
        if now.duration_since(last_cleanup) >= TICK {
            last_cleanup = now;
            context.node.try_cleanup_dead_nodes();
        }
        if now.duration_since(last_request) < context.spin {
            if let (Some(interval), Some(model)) = (context.warm, last_model)
                && now.duration_since(last_run) >= interval
            {
                warm(context, model);
                warm_runs.increment(1);
                last_run = Instant::now();
            }
            std::hint::spin_loop();
            continue;
        }
        // Sleep until a client says it sent something (or the tick passes).
        let _ = context.listener.timed_wait(|_| {}, TICK);
    }
}

/// Answers one request: a lookup here; an inference here when it can
/// finish without waiting, else on the async runtime (in a gathering round,
/// `round` keeps it until the round's runs: [`finish_round`]). The handle
/// of the model an inference asked for, when it named a known one.
#[allow(clippy::disallowed_methods)] // a request's latency is the machine's time
fn handle(
    context: &Context_,
    active: ActiveRequest,
    round: Option<(&Round, &mut Vec<Unfinished>)>,
) -> Option<u64> {
    crate::faults::shm_request();
    let started = Instant::now();
    let bytes = active.payload();
    let request_id = wire::request_id_of(bytes);
    let limit = context.edge.max_request_bytes;
    if bytes.len() > limit {
        let error = Error::PayloadTooLarge {
            got: bytes.len(),
            limit,
        };
        let error = context.edge.refuse(Protocol::Shm, "", started, error);
        respond_error(active, request_id, &error);
        return None;
    }
    // The client may still write its sample: what is checked and parsed is
    // a copy (the inputs are slices of it, not copied again).
    let owned = Bytes::copy_from_slice(bytes);
    let request = match wire::parse_request(&owned) {
        Ok(request) => request,
        Err(e) => {
            let error = Error::request("", e.to_string());
            let error = context.edge.refuse(Protocol::Shm, "", started, error);
            respond_error(active, request_id, &error);
            return None;
        }
    };
    match request {
        wire::Request::Lookup { name, version, .. } => {
            let (name, version) = (name.to_string(), version.to_string());
            lookup(context, active, request_id, name, version);
            None
        }
        wire::Request::Infer {
            request_id,
            handle,
            timeout_us,
            parameters,
            inputs,
        } => {
            let Some((name, version)) = context.resolve(handle) else {
                let error = Error::ModelNotFound {
                    model: format!("handle {handle:#018x}"),
                    version: None,
                    known: format!(
                        "{STALE_HANDLE}: a handle comes from a lookup to this server process"
                    ),
                };
                let error = context.edge.refuse(Protocol::Shm, "", started, error);
                respond_error(active, request_id, &error);
                return None;
            };
            let request = Infer {
                request_id,
                inputs: copy_inputs(&name, &parameters, &inputs, &owned),
                name,
                version,
                timeout_us,
                size: owned.len(),
                started,
            };
            infer(context, active, request, round);
            Some(handle)
        }
    }
}

/// Runs the model behind `handle` once on this thread (`latency.warm`): the
/// smallest bucket of each idle executor, nothing counted; a model gone
/// since is skipped.
fn warm(context: &Context_, handle: u64) {
    let Some((name, version)) = context.resolve(handle) else {
        return;
    };
    let version = (!version.is_empty()).then_some(version.as_str());
    if let Ok(model) = context.edge.runtime.model(&name, version) {
        model.warm_here();
    }
}

/// A request of a gathering round whose answer was not ready when it was
/// first polled.
struct Unfinished {
    active: ActiveRequest,
    request_id: u64,
    work: Work,
}

/// An inference through the edge, polled here first.
type Work = Pin<Box<dyn Future<Output = Result<InferResponse, Error>> + Send>>;

/// Runs what the round's requests parked (each model's rows together, on
/// this thread), then answers each request whose answer is now ready, in
/// the round's order; the rest finish on the async runtime.
fn finish_round(context: &Context_, round: &Round, unfinished: &mut Vec<Unfinished>) {
    round.run();
    let limit = context.max_answer_bytes;
    let mut poll_context = Context::from_waker(Waker::noop());
    for Unfinished {
        active,
        request_id,
        mut work,
    } in unfinished.drain(..)
    {
        match work.as_mut().poll(&mut poll_context) {
            Poll::Ready(result) => respond(active, request_id, result, limit),
            Poll::Pending => finish_later(context, active, request_id, work),
        }
    }
}

/// Answers `work` once the async runtime has finished it.
fn finish_later(context: &Context_, active: ActiveRequest, request_id: u64, work: Work) {
    let limit = context.max_answer_bytes;
    context.runtime.spawn(async move {
        let result = work.await;
        respond(active, request_id, result, limit);
    });
}

/// A request's inputs, copied out of the client's sample (which goes back
/// to the client with the answer), and its parameters, read: each, or why
/// it cannot be.
pub(crate) struct Inputs {
    /// The tensors, or why they cannot be read.
    pub(crate) tensors: Result<Vec<InputTensor>, Error>,
    /// The parameters, or why they cannot be read.
    pub(crate) parameters: Result<Parameters, Error>,
}

impl Payload for Inputs {
    type Encoding = ();

    fn decode_bytes(&self) -> usize {
        0
    }

    fn decode(self, _: &ModelHandle) -> Result<Decoded<()>, Error> {
        Ok(Decoded {
            id: String::new(),
            inputs: self.tensors?,
            outputs: None,
            parameters: self.parameters?,
            encoding: (),
        })
    }
}

/// A parameter of the wire's block as the parameter reader takes it.
fn param<'a>(value: &wire::ParamValue<'a>) -> Param<'a> {
    match *value {
        wire::ParamValue::Bool(b) => Param::Bool(b),
        wire::ParamValue::Int(i) => Param::Int(i),
        wire::ParamValue::Uint(u) => Param::Uint(u),
        wire::ParamValue::Double(x) => Param::Float(x),
        wire::ParamValue::Str(s) => Param::Str(s),
    }
}

/// The inputs of a request for `name` (the wire's tensors, slices of
/// `owned`, the request's copy), and its parameters, read by the edge's one
/// reader.
pub(crate) fn copy_inputs(
    name: &str,
    parameters: &[wire::Parameter<'_>],
    inputs: &[wire::TensorRef<'_>],
    owned: &Bytes,
) -> Inputs {
    // A parameter given twice: the last counts, as on every front end
    // (protobuf's rule for a map's repeated key, and JSON readers').
    let parameters = Parameters::read(name, |wanted| {
        parameters
            .iter()
            .rfind(|p| p.name == wanted)
            .map(|p| param(&p.value))
    });
    let tensors = inputs
            .iter()
            .map(|t| {
                let datatype = wire::datatype_name(t.datatype)
                    .and_then(DataType::parse)
                    .ok_or_else(|| {
                        Error::input(
                            name,
                            t.name,
                            "a datatype tickserve serves (BOOL, UINT8..UINT64, INT8..INT64, FP32, FP64)",
                            wire::datatype_name(t.datatype)
                                .map_or_else(|| format!("datatype number {}", t.datatype), str::to_string),
                        )
                    })?;
                Ok(InputTensor {
                    name: t.name.to_string(),
                    datatype,
                    shape: t.dims.clone(),
                    data: owned.slice_ref(t.data),
                })
            })
            .collect();
    Inputs {
        tensors,
        parameters,
    }
}

/// Runs an inference through the edge: polled once here, finished on the
/// async runtime if it must wait (kept in `round` when gathering).
fn infer(
    context: &Context_,
    active: ActiveRequest,
    request: Infer,
    round: Option<(&Round, &mut Vec<Unfinished>)>,
) {
    let edge = Arc::clone(&context.edge);
    let gather_in = round.as_ref().map(|(round, _)| Round::clone(round));
    let Infer {
        request_id,
        name,
        version,
        timeout_us,
        inputs,
        size,
        started,
    } = request;
    let work = async move {
        let call = Call {
            protocol: Protocol::Shm,
            model: &name,
            version: (!version.is_empty()).then_some(version.as_str()),
            bytes: RequestBytes::Count(size),
            // Shared memory carries no keys (docs/security.md): any process
            // of this host that can open the service may call it.
            key: None,
            traceparent: None,
            timeout: Ok((timeout_us > 0).then(|| Duration::from_micros(u64::from(timeout_us)))),
            started,
            // One host, no balancer: the parameter block names the sequence.
            sequence_key: Ok(None),
            round: gather_in,
        };
        edge.infer(call, inputs).await.map(|answer| answer.response)
    };
    let mut work: Work = Box::pin(work);
    let mut poll_context = Context::from_waker(Waker::noop());
    match work.as_mut().poll(&mut poll_context) {
        Poll::Ready(result) => respond(active, request_id, result, context.max_answer_bytes),
        Poll::Pending => match round {
            Some((_, unfinished)) => unfinished.push(Unfinished {
                active,
                request_id,
                work,
            }),
            None => finish_later(context, active, request_id, work),
        },
    }
}

/// An inference request off the wire, its inputs copied.
struct Infer {
    request_id: u64,
    name: String,
    version: String,
    timeout_us: u32,
    inputs: Inputs,
    /// The request's bytes, held in `server.max_inflight_bytes`.
    size: usize,
    started: Instant,
}

/// Answers a lookup: the model's handle and signature.
#[allow(clippy::disallowed_methods)] // a request's latency is the machine's time
fn lookup(
    context: &Context_,
    active: ActiveRequest,
    request_id: u64,
    name: String,
    version: String,
) {
    let started = Instant::now();
    let found = context
        .edge
        .runtime
        .model(&name, (!version.is_empty()).then_some(version.as_str()));
    let handle = match found {
        Ok(handle) => handle,
        Err(error) => {
            let error = context.edge.refuse(Protocol::Shm, &name, started, error);
            respond_error(active, request_id, &error);
            return;
        }
    };
    let token = context
        .handles
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .token(&name, canonical_version(&version, &handle.version));
    let Some(token) = token else {
        let error = Error::request(
            &handle.name,
            format!(
                "the shared-memory front end has handed out {MAX_HANDLES} model handles, its most"
            ),
        );
        respond_error(active, request_id, &error);
        return;
    };
    let describe = |specs: &[TensorSpec]| -> Vec<(String, u8, Vec<i64>)> {
        specs
            .iter()
            .map(|t| {
                let code = wire::datatype_code(t.datatype.as_str()).unwrap_or(0);
                (t.name.clone(), code, t.protocol_shape())
            })
            .collect()
    };
    let (inputs, outputs) = (
        describe(&handle.signature.inputs),
        describe(&handle.signature.outputs),
    );
    let (i, o) = (
        tensors_without_data(&inputs),
        tensors_without_data(&outputs),
    );
    let len = wire::lookup_answer_len(&i, &o);
    if len > context.max_answer_bytes {
        let error = too_large(&handle.name, "description", len, context.max_answer_bytes);
        return respond_error(active, request_id, &error);
    }
    let mut answer = vec![0u8; len];
    wire::write_lookup_answer(&mut answer, request_id, token, &i, &o);
    send(active, &answer);
}

/// A lookup answer's tensors: name, datatype number, protocol shape.
fn tensors_without_data(list: &[(String, u8, Vec<i64>)]) -> Vec<wire::TensorOut<'_>> {
    list.iter()
        .map(|(name, datatype, dims)| wire::TensorOut {
            name,
            datatype: *datatype,
            dims,
            data: &[],
        })
        .collect()
}

/// Sends an inference's answer (or its error); an answer over `limit` bytes
/// is refused instead.
fn respond(
    active: ActiveRequest,
    request_id: u64,
    result: Result<InferResponse, Error>,
    limit: usize,
) {
    let response = match result {
        Ok(response) => response,
        Err(error) => return respond_error(active, request_id, &error),
    };
    let codes: Vec<u8> = response
        .outputs
        .iter()
        .map(|o| wire::datatype_code(o.datatype.as_str()).unwrap_or(0))
        .collect();
    let outputs: Vec<wire::TensorOut<'_>> = response
        .outputs
        .iter()
        .zip(&codes)
        .map(|(o, &datatype)| wire::TensorOut {
            name: &o.name,
            datatype,
            dims: &o.shape,
            data: &o.data,
        })
        .collect();
    let len = wire::infer_answer_len(&outputs);
    if len > limit {
        let error = too_large(&response.model, "answer", len, limit);
        return respond_error(active, request_id, &error);
    }
    // The header's fields are 32-bit: a longer time reads as u32::MAX.
    let micros = |d: Duration| u32::try_from(durations::micros(d)).unwrap_or(u32::MAX);
    let mut answer = vec![0u8; len];
    wire::write_infer_answer(
        &mut answer,
        request_id,
        micros(response.timing.queue),
        micros(response.timing.compute),
        &outputs,
    );
    send(active, &answer);
}

/// The refusal of an answer (`what`: "answer" or "description") of `len`
/// bytes, over the front end's `limit`.
fn too_large(model: &str, what: &str, len: usize, limit: usize) -> Error {
    Error::request(
        model,
        format!(
            "the {what} is {len} bytes; shared memory answers at most {limit} \
             (shm.max_answer_bytes): ask for fewer rows, or use gRPC or HTTP"
        ),
    )
}

fn respond_error(active: ActiveRequest, request_id: u64, error: &Error) {
    let code = status::shm_code(error.kind());
    let message = error.client_message();
    let mut answer = vec![0u8; wire::error_answer_len(&message)];
    wire::write_error_answer(&mut answer, request_id, code, &message);
    send(active, &answer);
}

/// Copies `answer` into a sample loaned for the client and sends it. A
/// client that left (or never reads) costs nothing more: the send fails or
/// the sample is dropped with its connection.
fn send(active: ActiveRequest, answer: &[u8]) {
    let sent = active
        .loan_slice_uninit(answer.len())
        .map(|sample| sample.write_from_slice(answer))
        .map_err(|e| format!("{e:?}"))
        .and_then(|sample| sample.send().map_err(|e| format!("{e:?}")));
    if let Err(e) = sent {
        tracing::debug!(error = %e, "a shared-memory answer was not delivered (its client left?)");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn spellings_of_one_version_share_one_handle() {
        // The runtime resolves `01` and `+1` to version "1"; the handle is
        // kept under what it resolved to (empty stays "the default").
        assert_eq!(canonical_version("01", "1"), "1");
        assert_eq!(canonical_version("+1", "1"), "1");
        assert_eq!(canonical_version("", "1"), "");
        let mut handles = Handles::new();
        let one = handles.token("m", canonical_version("1", "1")).unwrap();
        for spelling in ["01", "+1", "001"] {
            assert_eq!(
                handles.token("m", canonical_version(spelling, "1")),
                Some(one)
            );
        }
        assert_eq!(handles.keys.len(), 1);
    }

    #[test]
    fn handles_are_random_64_bit_tokens_of_this_process_only() {
        let mut handles = Handles::new();
        let tokens: Vec<u64> = (0..100)
            .map(|i| handles.token(&format!("m{i}"), "").unwrap())
            .collect();
        let distinct: std::collections::HashSet<u64> = tokens.iter().copied().collect();
        assert_eq!(distinct.len(), 100);
        // Not an index, nor a small number: the upper half is used.
        assert!(tokens.iter().any(|t| t >> 32 != 0));
        assert!((0..4096u64).all(|guess| handles.resolve(guess).is_none()));
        assert_eq!(
            handles.resolve(tokens[7]),
            Some(("m7".into(), String::new()))
        );
        // Another process (another random state) resolves none of them.
        let other = Handles::new();
        assert!(tokens.iter().all(|&t| other.resolve(t).is_none()));
    }

    #[test]
    fn the_handle_table_is_bounded() {
        let mut handles = Handles::new();
        for i in 0..MAX_HANDLES {
            assert!(handles.token(&format!("m{i}"), "").is_some());
        }
        assert!(handles.token("one-more", "").is_none());
        assert!(
            handles.token("m0", "").is_some(),
            "a known key keeps its handle"
        );
    }
}
