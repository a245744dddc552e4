//! The shared-memory client (iceoryx2): blocking [`ShmClient`], and
//! [`AsyncShmClient`], which runs one on a thread of its own.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use iceoryx2::prelude::*;
use iceoryx2::service::builder::request_response::RequestResponseOpenError;
use tickserve_shm_protocol as wire;

use crate::{ClientError, DataType, Parameter, Tensor};

type Service = ipc_threadsafe::Service;
type RequestService =
    iceoryx2::service::port_factory::request_response::PortFactory<Service, [u8], (), [u8], ()>;
type WakeService = iceoryx2::service::port_factory::event::PortFactory<Service>;
type Client = iceoryx2::port::client::Client<Service, [u8], (), [u8], ()>;
type Notifier = iceoryx2::port::notifier::Notifier<Service>;

/// The service name a server with `[shm]` defaults serves.
pub const DEFAULT_SERVICE: &str = "tickserve";

/// How long a call waits for its answer unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a waiting call checks whether the server is still there.
const LIVENESS_CHECK: Duration = Duration::from_millis(100);

/// How long a waiting call polls without pause by default; after that it
/// yields its core between polls (on a machine with fewer cores than
/// spinning threads, the server's thread gets to run).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// One connection: node, service, client port, and the wake-up notifier.
struct Connection {
    node: Node<Service>,
    client: Client,
    notifier: Notifier,
    _services: (RequestService, WakeService),
}

impl Connection {
    fn open(service: &str) -> Result<Connection, ClientError> {
        let down = |what: &str, e: &dyn std::fmt::Debug| {
            ClientError::Disconnected(format!("{what} ({service}): {e:?}"))
        };
        let node = NodeBuilder::new()
            .signal_handling_mode(SignalHandlingMode::Disabled)
            .create::<Service>()
            .map_err(|e| down("cannot create an iceoryx2 node", &e))?;
        let infer: ServiceName = format!("{service}/infer")
            .as_str()
            .try_into()
            .map_err(|e| down("bad service name", &e))?;
        let requests = node
            .service_builder(&infer)
            .request_response::<[u8], [u8]>()
            .open()
            .map_err(|e| match e {
                RequestResponseOpenError::ExceedsMaxNumberOfNodes => down(
                    "the server takes no more clients (each client is a node)",
                    &e,
                ),
                _ => down("no server serves it; is [shm] enabled?", &e),
            })?;
        if requests.dynamic_config().number_of_servers() == 0 {
            return Err(ClientError::Disconnected(format!(
                "the service {service}/infer has no server"
            )));
        }
        let client = requests
            .client_builder()
            .initial_max_slice_len(1024)
            .allocation_strategy(AllocationStrategy::PowerOfTwo)
            .create()
            .map_err(|e| down("cannot create a client port", &e))?;
        let wake: ServiceName = format!("{service}/wake")
            .as_str()
            .try_into()
            .map_err(|e| down("bad service name", &e))?;
        let wake = node
            .service_builder(&wake)
            .event()
            .open()
            .map_err(|e| down("no wake-up event", &e))?;
        let notifier = wake
            .notifier_builder()
            .create()
            .map_err(|e| down("cannot create a notifier", &e))?;
        Ok(Connection {
            node,
            client,
            notifier,
            _services: (requests, wake),
        })
    }
}

/// A blocking shared-memory client; not shared between threads at once
/// (one per thread, or [`AsyncShmClient`]).
pub struct ShmClient {
    service: String,
    connection: Option<Connection>,
    /// Model name → (handle, output names).
    models: HashMap<String, u64>,
    next_id: u64,
    timeout: Duration,
    /// The deadline sent with each request; `None`: the timeout.
    deadline: Option<Duration>,
    /// The server's queue and compute time of the last answer.
    last_timing: Option<(Duration, Duration)>,
    /// How long a call polls for its answer without pause.
    spin: Duration,
}

impl ShmClient {
    /// Connects to the server with `[shm]`'s default service name.
    pub fn connect() -> Result<ShmClient, ClientError> {
        ShmClient::connect_to(DEFAULT_SERVICE)
    }

    /// Connects to the server serving `service` (its `shm.service`).
    pub fn connect_to(service: &str) -> Result<ShmClient, ClientError> {
        Ok(ShmClient {
            service: service.to_string(),
            connection: Some(Connection::open(service)?),
            models: HashMap::new(),
            next_id: 1,
            timeout: DEFAULT_TIMEOUT,
            deadline: None,
            last_timing: None,
            spin: DEFAULT_SPIN,
        })
    }

    /// The server's own time for the last answered request: in the model's
    /// queue, and computing (copying rows in, running, copying out), as the
    /// answer's header reports them.
    pub fn last_timing(&self) -> Option<(Duration, Duration)> {
        self.last_timing
    }

    /// Sets how long a call waits for its answer (and, without
    /// [`ShmClient::set_deadline`], the deadline the server gets).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sets the deadline each request carries to the server (its header's
    /// `timeout_us`): past it the server answers `DEADLINE_EXCEEDED` without
    /// computing. `None` (the default) sends the call's timeout.
    pub fn set_deadline(&mut self, deadline: Option<Duration>) {
        self.deadline = deadline;
    }

    /// Sets how long a call polls for its answer without pause before it
    /// yields its core between polls ([`DEFAULT_SPIN`]). Many clients on
    /// fewer cores send more at once with 0: a spinning client holds a core
    /// its neighbours would send from. `Duration::MAX` polls for the whole
    /// call, never yielding: a client on a core of its own facing a server
    /// in the latency mode (docs/shm.md).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Runs `model` (its default version) on `inputs`; returns its outputs.
    pub fn infer(&mut self, model: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, ClientError> {
        self.infer_with(model, inputs, &[])
    }

    /// [`ShmClient::infer`] with request parameters, as the v2 protocol
    /// names them (`priority`, `sequence_id`, `sequence_start`,
    /// `sequence_end`, `mc_samples`, ...; docs/protocol.md).
    pub fn infer_with(
        &mut self,
        model: &str,
        inputs: &[Tensor],
        parameters: &[Parameter<'_>],
    ) -> Result<Vec<Tensor>, ClientError> {
        let cached = self.models.contains_key(model);
        match self.infer_once(model, inputs, parameters) {
            // A handle from before the server restarted: look the model up
            // again and send once more (the request never ran).
            Err(ClientError::Server { code, message })
                if cached && code == "NOT_FOUND" && message.contains("stale model handle") =>
            {
                self.infer_once(model, inputs, parameters)
            }
            other => other,
        }
    }

    fn infer_once(
        &mut self,
        model: &str,
        inputs: &[Tensor],
        parameters: &[Parameter<'_>],
    ) -> Result<Vec<Tensor>, ClientError> {
        if parameters.len() > wire::MAX_PARAMETERS {
            return Err(ClientError::Transport(format!(
                "{} parameters; a request carries at most {}",
                parameters.len(),
                wire::MAX_PARAMETERS
            )));
        }
        let too_long = |text: &str| text.len() > wire::MAX_PARAMETER_BYTES;
        if let Some(p) = parameters.iter().find(|p| {
            too_long(p.name) || matches!(p.value, wire::ParamValue::Str(s) if too_long(s))
        }) {
            return Err(ClientError::Transport(format!(
                "parameter {}: names and strings take at most {} bytes",
                p.name,
                wire::MAX_PARAMETER_BYTES
            )));
        }
        let handle = match self.models.get(model) {
            Some(&handle) => handle,
            None => {
                let handle = self.lookup(model)?;
                self.models.insert(model.to_string(), handle);
                handle
            }
        };
        let codes: Vec<u8> = inputs
            .iter()
            .map(|t| wire::datatype_code(t.datatype.as_str()).unwrap_or(0))
            .collect();
        let tensors: Vec<wire::TensorOut<'_>> = inputs
            .iter()
            .zip(&codes)
            .map(|(t, &datatype)| wire::TensorOut {
                name: &t.name,
                datatype,
                dims: &t.shape,
                data: &t.data,
            })
            .collect();
        let id = self.next_id();
        let deadline = self.deadline.unwrap_or(self.timeout);
        let timeout_us = u32::try_from(deadline.as_micros()).unwrap_or(u32::MAX);
        let len = wire::infer_request_len(parameters, &tensors);
        let answer = self.call(len, |buffer| {
            wire::write_infer_request(buffer, id, handle, timeout_us, parameters, &tensors);
        })?;
        match wire::parse_answer(&answer).map_err(|e| ClientError::Transport(e.to_string()))? {
            wire::DecodedAnswer::Infer {
                outputs,
                queue_us,
                compute_us,
                ..
            } => {
                self.last_timing = Some((
                    Duration::from_micros(u64::from(queue_us)),
                    Duration::from_micros(u64::from(compute_us)),
                ));
                outputs
                    .iter()
                    .map(|t| {
                        let datatype = wire::datatype_name(t.datatype)
                            .and_then(DataType::parse)
                            .ok_or_else(|| {
                                ClientError::Transport(format!("datatype number {}", t.datatype))
                            })?;
                        Ok(Tensor {
                            name: t.name.to_string(),
                            datatype,
                            shape: t.dims.clone(),
                            data: t.data.to_vec(),
                        })
                    })
                    .collect()
            }
            wire::DecodedAnswer::Error { code, message, .. } => {
                if code == wire::ErrorCode::NotFound {
                    // The server may have restarted and its handles with it.
                    self.models.remove(model);
                }
                Err(ClientError::Server {
                    code: code.as_str().to_string(),
                    message: message.to_string(),
                })
            }
            wire::DecodedAnswer::Lookup { .. } => Err(ClientError::Transport(
                "a lookup answer to an inference request".to_string(),
            )),
        }
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    fn lookup(&mut self, model: &str) -> Result<u64, ClientError> {
        let id = self.next_id();
        let len = wire::lookup_request_len(model, "");
        let answer = self.call(len, |buffer| {
            wire::write_lookup_request(buffer, id, model, "")
        })?;
        match wire::parse_answer(&answer).map_err(|e| ClientError::Transport(e.to_string()))? {
            wire::DecodedAnswer::Lookup { handle, .. } => Ok(handle),
            wire::DecodedAnswer::Error { code, message, .. } => Err(ClientError::Server {
                code: code.as_str().to_string(),
                message: message.to_string(),
            }),
            wire::DecodedAnswer::Infer { .. } => Err(ClientError::Transport(
                "an inference answer to a lookup".to_string(),
            )),
        }
    }

    /// Sends a request of `len` bytes written by `write` straight into the
    /// shared-memory sample, and waits for its answer.
    fn call(&mut self, len: usize, write: impl FnOnce(&mut [u8])) -> Result<Vec<u8>, ClientError> {
        if self.connection.is_none() {
            self.connection = Some(Connection::open(&self.service)?);
            self.models.clear();
        }
        let result = self.exchange(len, write);
        if matches!(result, Err(ClientError::Disconnected(_))) {
            // Connect anew on the next call.
            self.connection = None;
            self.models.clear();
        }
        result
    }

    #[allow(clippy::disallowed_methods)] // a client's waits and timeouts are the machine's time
    fn exchange(
        &mut self,
        len: usize,
        write: impl FnOnce(&mut [u8]),
    ) -> Result<Vec<u8>, ClientError> {
        let (timeout, spin) = (self.timeout, self.spin);
        let Some(connection) = self.connection.as_ref() else {
            return Err(ClientError::Disconnected("not connected".to_string()));
        };
        let transport =
            |what: &str, e: &dyn std::fmt::Debug| ClientError::Transport(format!("{what}: {e:?}"));
        let mut request = connection
            .client
            .loan_slice(len)
            .map_err(|e| transport("cannot loan a request sample", &e))?;
        write(request.payload_mut());
        let pending = request
            .send()
            .map_err(|e| ClientError::Disconnected(format!("cannot send: {e:?}")))?;
        // Wake the server in case it sleeps (it polls while busy).
        let _ = connection.notifier.notify();
        let started = Instant::now();
        let mut checked = started;
        loop {
            match pending.receive() {
                Ok(Some(response)) => return Ok(response.payload().to_vec()),
                Ok(None) => {}
                Err(e) => return Err(transport("cannot receive", &e)),
            }
            let now = Instant::now();
            if now.duration_since(started) >= timeout {
                return Err(ClientError::Timeout(timeout));
            }
            if now.duration_since(checked) >= LIVENESS_CHECK {
                checked = now;
                connection.node.try_cleanup_dead_nodes();
                if !pending.is_connected() {
                    // The server lets a request go once it has answered: an
                    // answer that came since the last look is still here.
                    if let Ok(Some(response)) = pending.receive() {
                        return Ok(response.payload().to_vec());
                    }
                    return Err(ClientError::Disconnected(
                        "the server went away while the request was in flight".to_string(),
                    ));
                }
            }
            if now.duration_since(started) < spin {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// A request for the client thread, and where its answer goes.
type Job = (
    String,
    Vec<Tensor>,
    tokio::sync::oneshot::Sender<Result<Vec<Tensor>, ClientError>>,
);

/// An async shared-memory client: a [`ShmClient`] on a thread of its own,
/// fed through a channel. Cheap to clone; calls run one at a time, in order.
#[derive(Clone)]
pub struct AsyncShmClient {
    jobs: std::sync::mpsc::Sender<Job>,
}

impl AsyncShmClient {
    /// Connects to the server with `[shm]`'s default service name.
    pub fn connect() -> Result<AsyncShmClient, ClientError> {
        AsyncShmClient::connect_to(DEFAULT_SERVICE)
    }

    /// Connects to the server serving `service`.
    pub fn connect_to(service: &str) -> Result<AsyncShmClient, ClientError> {
        let mut client = ShmClient::connect_to(service)?;
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("tickserve-shm-client".to_string())
            .spawn(move || {
                for (model, inputs, reply) in queue {
                    let _ = reply.send(client.infer(&model, &inputs));
                }
            })
            .map_err(|e| ClientError::Transport(format!("cannot start the client thread: {e}")))?;
        Ok(AsyncShmClient { jobs })
    }

    /// Runs `model` on `inputs`; returns its outputs.
    pub async fn infer(
        &self,
        model: &str,
        inputs: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, ClientError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs
            .send((model.to_string(), inputs, reply))
            .map_err(|_| ClientError::Transport("the client thread stopped".to_string()))?;
        answer
            .await
            .map_err(|_| ClientError::Transport("the client thread stopped".to_string()))?
    }
}
