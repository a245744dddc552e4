//! Model control for both front ends (Triton's model repository extension):
//! the repository index, and loading and unloading models while serving.
//! Loading reads files and may compile, so every operation runs on a blocking
//! thread, never on the async workers that answer inference requests.
//!
//! With `security.model_control_mode = "none"` (the default) or `"poll"`
//! (the repository's files decide) load and unload are refused with
//! FAILED_PRECONDITION / HTTP 403, counted by protocol; the index stays
//! readable.

use std::sync::Arc;

use tickserve_core::Error;
use tickserve_core::config::ModelControlMode;
use tickserve_core::metrics as names;
use tickserve_runtime::IndexEntry;

use tickserve_edge::Edge;
use tickserve_edge::observe::Protocol;

/// A model control operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Load or reload a model from the repository.
    Load,
    /// Unload a model.
    Unload,
}

/// Loads or unloads `model` (see [`tickserve_runtime::Runtime::load_model`]),
/// asked over `protocol`.
pub async fn change(
    edge: &Arc<Edge>,
    protocol: Protocol,
    operation: Operation,
    model: String,
) -> Result<(), Error> {
    let named = match operation {
        Operation::Load => "load",
        Operation::Unload => "unload",
    };
    let refused = match edge.model_control_mode {
        ModelControlMode::Explicit => None,
        ModelControlMode::None => Some(Error::ModelControlOff {
            model: model.clone(),
            operation: named,
        }),
        ModelControlMode::Poll => Some(Error::ModelControlPolled {
            model: model.clone(),
            operation: named,
        }),
    };
    if let Some(error) = refused {
        metrics::counter!(names::MODEL_CONTROL_REFUSED, "protocol" => protocol.label())
            .increment(1);
        return Err(error);
    }
    if !edge.ready() {
        return Err(Error::ShuttingDown);
    }
    let edge = Arc::clone(edge);
    let label = model.clone();
    tokio::task::spawn_blocking(move || match operation {
        Operation::Load => edge.runtime.load_model(&model),
        Operation::Unload => edge.runtime.unload_model(&model),
    })
    .await
    .unwrap_or_else(|e| {
        Err(Error::Internal {
            model: label,
            message: format!("the model control task failed: {e}"),
        })
    })
}

/// The repository index; with `ready_only`, only the versions that serve.
pub async fn index(edge: &Arc<Edge>, ready_only: bool) -> Result<Vec<IndexEntry>, Error> {
    let indexing = Arc::clone(edge);
    let entries = tokio::task::spawn_blocking(move || indexing.runtime.index())
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|message| Error::Internal {
            model: "_repository".to_string(),
            message,
        })?;
    // A halted version is loaded and warm, and answers nothing.
    let mut entries = entries;
    for entry in &mut entries {
        if entry.state == "READY"
            && let Some(halt) = edge.halts.check(&entry.name, &entry.version)
        {
            entry.state = "HALTED";
            entry.reason = format!("halted {}", halt.words());
        }
    }
    Ok(entries
        .into_iter()
        .filter(|e| !ready_only || e.state == "READY")
        .collect())
}

/// The repository poll (`security.model_control_mode = "poll"`): reads the
/// repository every `interval` and applies what changed (see
/// [`tickserve_runtime::Runtime::poll_repository`]), on a blocking thread,
/// until `stopped` turns true.
pub async fn poll_repository(
    edge: Arc<Edge>,
    interval: std::time::Duration,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut poller = edge.runtime.poller();
    loop {
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(interval) => {}
        }
        if !edge.ready() {
            return;
        }
        let polling = Arc::clone(&edge);
        let polled = tokio::task::spawn_blocking(move || {
            polling.runtime.poll_repository(&mut poller);
            poller
        })
        .await;
        match polled {
            Ok(p) => poller = p,
            // A panic outside a model's update (each is caught) takes the
            // poll's memory of what it applied with it: start again from
            // what the runtime loaded at its start, and keep polling.
            Err(e) => {
                tracing::error!(error = %e, "the repository poll panicked; it starts again from the repository as loaded at start");
                poller = edge.runtime.poller();
            }
        }
    }
}
