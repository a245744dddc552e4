//! What CUDA this machine has, found once at startup without panicking.
//!
//! cudarc loads `libcuda` lazily and panics when it is missing, so the probe
//! first asks whether the library can be loaded at all
//! (`is_culib_present`), and only then counts the devices. The server logs
//! the result in one line and places `auto` models accordingly.

/// One CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Its ordinal (`gpu:N`).
    pub ordinal: usize,
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Its memory in bytes.
    pub memory: usize,
}

/// The CUDA devices found, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    /// No usable CUDA: the reason, for the log and for errors.
    Absent(String),
    /// One or more devices.
    Present(Vec<GpuInfo>),
}

impl Gpus {
    /// Looks for the CUDA driver and its devices.
    pub fn probe() -> Gpus {
        // SAFETY: only tries to dlopen the driver library; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Gpus::Absent("no CUDA driver (libcuda.so cannot be loaded)".to_string());
        }
        match std::panic::catch_unwind(list_devices) {
            Ok(Ok(devices)) if devices.is_empty() => {
                Gpus::Absent("the CUDA driver reports no devices".to_string())
            }
            Ok(Ok(devices)) => Gpus::Present(devices),
            Ok(Err(e)) => Gpus::Absent(format!("the CUDA driver failed: {e}")),
            Err(_) => Gpus::Absent("the CUDA driver could not be used".to_string()),
        }
    }

    /// The devices (none when absent).
    pub fn devices(&self) -> &[GpuInfo] {
        match self {
            Gpus::Absent(_) => &[],
            Gpus::Present(devices) => devices,
        }
    }

    /// One line for the startup log.
    pub fn describe(&self) -> String {
        match self {
            Gpus::Absent(reason) => format!("{reason}: models placed \"auto\" run on the CPU"),
            Gpus::Present(devices) => devices
                .iter()
                .map(|d| format!("gpu:{} {} ({} MiB)", d.ordinal, d.name, d.memory >> 20))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

fn list_devices() -> Result<Vec<GpuInfo>, cudarc::driver::DriverError> {
    use cudarc::driver::result;
    result::init()?;
    let count = result::device::get_count()?;
    (0..count)
        .map(|ordinal| {
            let device = result::device::get(ordinal)?;
            Ok(GpuInfo {
                ordinal: ordinal as usize,
                name: result::device::get_name(device)?,
                // SAFETY: `device` came from the driver just above.
                memory: unsafe { result::device::total_mem(device)? },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_a_driver_says_so_and_does_not_panic() {
        let gpus = Gpus::probe();
        // On the GPU machine this finds devices; elsewhere it explains.
        match &gpus {
            Gpus::Absent(reason) => {
                assert!(gpus.devices().is_empty());
                assert!(gpus.describe().contains(reason.as_str()));
                assert!(gpus.describe().contains("CPU"));
            }
            Gpus::Present(devices) => assert!(!devices.is_empty()),
        }
    }
}
