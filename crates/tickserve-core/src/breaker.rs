//! A version's circuit breaker (`[breaker]` in `model.toml`): `trips` guard
//! trips within `window` halt the version, as the kill switch does; its
//! traffic then goes to `fallback` (a label or version of the same model
//! with the same signature) when one is named, else it is refused.

use std::time::Duration;

use serde::Deserialize;

/// The longest window a breaker counts over.
pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// `[breaker]` of `model.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    /// Guard trips that halt the version, counted within `window`.
    pub trips: u32,
    /// How far back trips count (`"10s"`).
    #[serde(deserialize_with = "crate::durations::deserialize")]
    pub window: Duration,
    /// The label or version that answers the version's requests while it
    /// is halted; none: they are refused.
    pub fallback: Option<String>,
}

impl BreakerConfig {
    /// Checks the numbers: at least one trip, a window from 1 ms to a day,
    /// a fallback that is not empty.
    pub fn check(&self) -> Result<(), String> {
        if self.trips == 0 {
            return Err("breaker.trips must be at least 1".to_string());
        }
        if self.window < Duration::from_millis(1) || self.window > MAX_WINDOW {
            return Err(format!(
                "breaker.window must be from 1ms to 24h; got {:?}",
                self.window
            ));
        }
        if self.fallback.as_deref().is_some_and(str::is_empty) {
            return Err("breaker.fallback must name a label or version".to_string());
        }
        Ok(())
    }
}
