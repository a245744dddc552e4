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

mod answer;
mod handles;
mod infer;
mod inputs;
mod lookup;
mod rounds;
mod serve;
mod supervise;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;
use iceoryx2::prelude::*;
use tickserve_core::config::ShmConfig;
use tickserve_edge::Edge;

use handles::Handles;
pub(crate) use inputs::copy_inputs;
use supervise::supervise;

/// How often a sleeping front-end thread wakes to clean up after dead clients.
pub const TICK: Duration = Duration::from_millis(100);

/// The start of the message for a handle this server did not give out.
pub const STALE_HANDLE: &str = "unknown or stale model handle";

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
