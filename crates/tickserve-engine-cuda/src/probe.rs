//! What CUDA this machine has, found once at startup without panicking.
//!
//! cudarc loads its libraries lazily and panics when one is missing, so the
//! probe first asks whether each can be loaded at all (`is_culib_present`):
//! the driver (`libcuda`), then the two the engine compiles with (cuBLAS and
//! NVRTC), and only then counts the devices. A machine whose driver works but
//! lacks cuBLAS or NVRTC has no usable GPU: `auto` models run on the CPU and
//! a model placed on `gpu:N` stops the start, each saying which library is
//! missing. The server logs the result in one line.

/// One CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Its ordinal (`gpu:N`).
    pub ordinal: usize,
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Its memory in bytes.
    pub memory: usize,
    /// Its compute capability (`(9, 0)` for an H100).
    pub capability: (i32, i32),
    /// Its streaming multiprocessors.
    pub multiprocessors: i32,
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
    /// The CUDA driver's version (`13.0`), where it loads.
    pub fn driver_version() -> Option<String> {
        // SAFETY: only tries to dlopen the driver; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return None;
        }
        // SAFETY: the driver loads (checked above); one int written.
        let (status, version) = std::panic::catch_unwind(|| unsafe {
            let mut version = 0;
            let status = cudarc::driver::sys::cuDriverGetVersion(&mut version);
            (status, version)
        })
        .ok()?;
        (status == cudarc::driver::sys::CUresult::CUDA_SUCCESS)
            .then(|| format!("{}.{}", version / 1000, version % 1000 / 10))
    }

    /// The versions of the libraries the engine compiles with, where they
    /// load: `cuBLAS 13.0.2, NVRTC 13.0` (`none` for one that does not).
    pub fn library_versions() -> String {
        use cudarc::cublas::sys as blas;
        use cudarc::nvrtc::sys as nvrtc;
        // SAFETY: each is called only when its library loads; ints written.
        let cublas = unsafe { blas::is_culib_present() }
            .then(|| {
                std::panic::catch_unwind(|| unsafe {
                    let mut part = [0; 3];
                    let kinds = [
                        blas::libraryPropertyType::MAJOR_VERSION,
                        blas::libraryPropertyType::MINOR_VERSION,
                        blas::libraryPropertyType::PATCH_LEVEL,
                    ];
                    for (value, kind) in part.iter_mut().zip(kinds) {
                        if blas::cublasGetProperty(kind, value)
                            != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                        {
                            return None;
                        }
                    }
                    Some(format!("{}.{}.{}", part[0], part[1], part[2]))
                })
                .ok()
                .flatten()
            })
            .flatten();
        // SAFETY: as above.
        let nvrtc = unsafe { nvrtc::is_culib_present() }
            .then(|| {
                std::panic::catch_unwind(|| unsafe {
                    let (mut major, mut minor) = (0, 0);
                    (nvrtc::nvrtcVersion(&mut major, &mut minor)
                        == nvrtc::nvrtcResult::NVRTC_SUCCESS)
                        .then(|| format!("{major}.{minor}"))
                })
                .ok()
                .flatten()
            })
            .flatten();
        format!(
            "cuBLAS {}, NVRTC {}",
            cublas.as_deref().unwrap_or("none"),
            nvrtc.as_deref().unwrap_or("none")
        )
    }

    /// Looks for the CUDA driver and its devices.
    pub fn probe() -> Gpus {
        // SAFETY: only tries to dlopen the driver library; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Gpus::Absent("no CUDA driver (libcuda.so cannot be loaded)".to_string());
        }
        if let Some(missing) = missing_libraries() {
            return Gpus::Absent(missing);
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
                .map(|d| {
                    format!(
                        "gpu:{} {} ({} MiB, sm_{}{}, {} SMs)",
                        d.ordinal,
                        d.name,
                        d.memory >> 20,
                        d.capability.0,
                        d.capability.1,
                        d.multiprocessors
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// The libraries the engine needs beside the driver that cannot be loaded,
/// as one sentence; `None` when both load.
pub fn missing_libraries() -> Option<String> {
    // SAFETY: each only tries to dlopen its library; no symbol is called.
    let found = unsafe {
        [
            (
                "cuBLAS (libcublas.so.13)",
                cudarc::cublas::sys::is_culib_present(),
            ),
            (
                "NVRTC (libnvrtc.so.13)",
                cudarc::nvrtc::sys::is_culib_present(),
            ),
        ]
    };
    let missing: Vec<&str> = found
        .iter()
        .filter(|(_, present)| !present)
        .map(|(name, _)| *name)
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "the CUDA driver loads but {} cannot be loaded (put the CUDA toolkit's lib64, or the \
             nvidia wheels' cu13/lib, on LD_LIBRARY_PATH)",
            missing.join(" and ")
        )
    })
}

fn list_devices() -> Result<Vec<GpuInfo>, cudarc::driver::DriverError> {
    use cudarc::driver::result;
    result::init()?;
    let count = result::device::get_count()?;
    (0..count)
        .map(|ordinal| {
            let device = result::device::get(ordinal)?;
            use cudarc::driver::sys::CUdevice_attribute as A;
            // SAFETY: `device` came from the driver just above.
            let attribute = |a| unsafe { result::device::get_attribute(device, a) };
            Ok(GpuInfo {
                ordinal: ordinal as usize,
                name: result::device::get_name(device)?,
                // SAFETY: `device` came from the driver just above.
                memory: unsafe { result::device::total_mem(device)? },
                capability: (
                    attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                    attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                ),
                multiprocessors: attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
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

    /// This machine has NVRTC (`.local/lib`, from scripts/setup.sh) and no
    /// cuBLAS: the probe's sentence names what is missing and where to put it.
    #[test]
    fn a_missing_cublas_is_named_not_a_panic() {
        // SAFETY: only tries to dlopen the library.
        let cublas = unsafe { cudarc::cublas::sys::is_culib_present() };
        match missing_libraries() {
            Some(reason) => {
                assert!(!cublas || reason.contains("NVRTC"), "{reason}");
                if !cublas {
                    assert!(reason.contains("libcublas.so.13"), "{reason}");
                }
                assert!(reason.contains("LD_LIBRARY_PATH"), "{reason}");
            }
            None => assert!(cublas),
        }
    }
}
