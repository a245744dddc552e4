//! The process's record of where resident kernels run, which what else
//! runs beside them consults. A resident block holds a multiprocessor for
//! as long as its kernel runs, so a kernel starts only where every resident
//! block still has one ([`Reservation`]); a synchronous free on a device
//! where one runs may wait for an idle device that never comes, so frees
//! consult the record ([`free_device`], [`free_host`]).

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::{result, sys};
use tickserve_core::EngineError;

/// Resident blocks per device, and the host memory whose free waits.
#[derive(Debug, Default)]
struct Registry {
    /// Resident blocks launched per device (by ordinal).
    blocks: Vec<usize>,
    /// Pinned host memory freed while a resident kernel ran (addresses).
    deferred: Vec<usize>,
}

impl Registry {
    /// Takes `slots` blocks on device `ordinal` of `sms` multiprocessors.
    fn take(&mut self, ordinal: usize, slots: usize, sms: usize) -> Result<(), EngineError> {
        if self.blocks.len() <= ordinal {
            self.blocks.resize(ordinal + 1, 0);
        }
        let running = self.blocks[ordinal];
        if running.saturating_add(slots) > sms {
            return Err(EngineError::Unsupported(format!(
                "gpu:{ordinal}: {slots} resident slots, and {running} of the device's {sms} \
                 multiprocessors already hold resident blocks (a resident block holds one for \
                 as long as it runs)"
            )));
        }
        self.blocks[ordinal] = running + slots;
        Ok(())
    }

    /// Gives `slots` blocks of device `ordinal` back: the host memory to
    /// free now, once no resident block is left anywhere.
    fn release(&mut self, ordinal: usize, slots: usize) -> Vec<usize> {
        if let Some(running) = self.blocks.get_mut(ordinal) {
            *running = running.saturating_sub(slots);
        }
        if self.any() {
            Vec::new()
        } else {
            std::mem::take(&mut self.deferred)
        }
    }

    /// Whether a resident block runs on any device.
    fn any(&self) -> bool {
        self.blocks.iter().any(|&b| b > 0)
    }

    /// Keeps host memory at `address` to free later, while a resident
    /// kernel runs: whether it did.
    fn defer(&mut self, address: usize) -> bool {
        let any = self.any();
        if any {
            self.deferred.push(address);
        }
        any
    }
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    blocks: Vec::new(),
    deferred: Vec::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// `slots` of device `ordinal`'s multiprocessors, taken for a resident
/// kernel until dropped.
#[derive(Debug)]
pub struct Reservation {
    ordinal: usize,
    slots: usize,
}

impl Reservation {
    /// Takes `slots` blocks on device `ordinal` of `sms` multiprocessors,
    /// where every resident block of the process, these too, still has one
    /// of its own (a block that is never scheduled would leave its slot
    /// unanswered).
    pub fn take(ordinal: usize, slots: usize, sms: usize) -> Result<Reservation, EngineError> {
        registry().take(ordinal, slots, sms)?;
        Ok(Reservation { ordinal, slots })
    }
}

impl Drop for Reservation {
    /// Dropped once its kernel has returned: the host memory kept while
    /// resident kernels ran is freed when this was the last.
    fn drop(&mut self) {
        let freed = registry().release(self.ordinal, self.slots);
        for address in freed {
            // SAFETY: pinned host memory handed to `free_host`, kept unfreed
            // until now, freed once.
            let _ = unsafe { result::free_host(address as *mut c_void) };
        }
    }
}

/// Whether a resident kernel runs on device `ordinal`.
pub fn runs_on(ordinal: usize) -> bool {
    registry().blocks.get(ordinal).is_some_and(|&b| b > 0)
}

/// Frees device memory at `ptr` on device `ordinal`: in stream order on
/// the legacy stream (which does not wait for a resident kernel's
/// non-blocking stream) while a resident kernel runs there, else at once.
///
/// # Safety
///
/// `ptr` was allocated on that device in the current context, is freed
/// once, and no work still reads or writes it.
pub unsafe fn free_device(ptr: sys::CUdeviceptr, ordinal: usize) {
    if runs_on(ordinal) {
        // SAFETY: this function's contract.
        let _ = unsafe { result::free_async(ptr, std::ptr::null_mut()) };
    } else {
        // SAFETY: this function's contract.
        let _ = unsafe { result::free_sync(ptr) };
    }
}

/// Frees pinned host memory at `ptr`: at once, or, while a resident kernel
/// runs anywhere in the process, once the last has returned.
///
/// # Safety
///
/// `ptr` was allocated with `cuMemHostAlloc`, is freed once, and nothing
/// uses it any more.
pub unsafe fn free_host(ptr: *mut c_void) {
    if !registry().defer(ptr as usize) {
        // SAFETY: this function's contract.
        let _ = unsafe { result::free_host(ptr) };
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn resident_blocks_of_every_kernel_on_a_device_fit_its_multiprocessors() {
        // Device 7 of 132 multiprocessors (no other test reserves on it).
        let first = Reservation::take(7, 64, 132).unwrap();
        let second = Reservation::take(7, 64, 132).unwrap();
        let refused = Reservation::take(7, 8, 132).err().unwrap().to_string();
        assert!(
            refused.contains("128 of the device's 132 multiprocessors"),
            "{refused}"
        );
        assert!(runs_on(7) && !runs_on(9));
        // Another device is its own.
        drop(Reservation::take(8, 132, 132).unwrap());
        // A kernel that returned gives its blocks back.
        drop(first);
        let third = Reservation::take(7, 68, 132).unwrap();
        drop((second, third));
        drop(Reservation::take(7, 132, 132).unwrap());
    }

    #[test]
    fn host_memory_freed_while_a_resident_kernel_runs_waits_for_the_last_to_return() {
        let mut registry = Registry::default();
        // No resident kernel: freed at once.
        assert!(!registry.defer(0x1000));
        registry.take(0, 4, 132).unwrap();
        registry.take(1, 2, 132).unwrap();
        assert!(registry.defer(0x2000));
        assert!(registry.defer(0x3000));
        // One device's kernel returned, another's runs: still kept.
        assert!(registry.release(0, 4).is_empty());
        assert!(registry.defer(0x4000));
        // The last returned: all of it, once.
        assert_eq!(registry.release(1, 2), [0x2000, 0x3000, 0x4000]);
        assert!(registry.release(1, 0).is_empty());
        assert!(!registry.defer(0x5000));
    }
}
