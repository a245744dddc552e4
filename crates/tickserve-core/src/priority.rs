//! Priority levels and their queue policies, as Triton configures them
//! (`priority_levels`, `default_priority_level`, `default_queue_policy`,
//! `priority_queue_policy`). The request parameter `priority` is read by the
//! server's one parameter reader.
//!
//! Level 1 is the highest. A request's `priority` picks its level; 0, or a
//! value above the model's levels, means the default level (Triton's rule).
//! Each level's policy bounds how many of its requests may wait
//! (`max_queue_size`, 0 for no bound beyond the model's row and byte bounds)
//! and how long (`default_timeout`): past it, `timeout_action = "reject"`
//! refuses the request (DEADLINE_EXCEEDED), `"delay"` moves it behind every
//! other request. Unlike Triton, a request's own timeout is always honoured,
//! whatever `allow_timeout_override` says: a deadline a client sets is never
//! ignored.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Deserializer};

use crate::durations::{self, MAX_TIMEOUT};

/// The most priority levels a model may have.
pub const MAX_LEVELS: u32 = 64;

/// What happens to a request that waited its level's `default_timeout`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutAction {
    /// Refuse it (DEADLINE_EXCEEDED), as a passed deadline is.
    #[default]
    Reject,
    /// Move it behind every other request.
    Delay,
}

/// One level's queue policy as `model.toml` writes it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueuePolicyConfig {
    /// `reject` (the default) or `delay`.
    pub timeout_action: TimeoutAction,
    /// How long a request of this level may wait (`"2ms"`); absent or zero:
    /// no limit.
    #[serde(deserialize_with = "optional_duration")]
    pub default_timeout: Option<Duration>,
    /// Triton's key, accepted for its configurations; tickserve always
    /// honours a request's own timeout.
    pub allow_timeout_override: Option<bool>,
    /// The most requests of this level waiting; 0 (the default): no bound
    /// beyond the model's.
    pub max_queue_size: usize,
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    crate::durations::deserialize(d).map(|t| (!t.is_zero()).then_some(t))
}

/// A model's priority settings as `model.toml` writes them.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityConfig {
    /// Levels, 1 the highest; 0 (the default): no priorities.
    pub priority_levels: u32,
    /// The level of a request without a valid `priority` (default: the lowest).
    pub default_priority_level: Option<u32>,
    /// The policy of every level without its own.
    pub default_queue_policy: QueuePolicyConfig,
    /// Policies by level (`[priority.priority_queue_policy.1]`).
    pub priority_queue_policy: BTreeMap<String, QueuePolicyConfig>,
    /// Executors of the model that run level-1 requests only (tickserve's
    /// own key; 0, the default: none). Lower levels share the others, so it
    /// must be below `executors`: a level-1 request then finds an executor
    /// that no lower level's run can be holding.
    pub reserved_executors: usize,
}

/// One level's policy, resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueuePolicy {
    /// What a request that waited `timeout` gets.
    pub timeout_action: TimeoutAction,
    /// How long a request of the level may wait.
    pub timeout: Option<Duration>,
    /// The most of its requests waiting; 0: no bound of its own.
    pub max_queue_size: usize,
}

/// A model's priority levels, resolved and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priorities {
    /// Policies, index `level - 1`; one entry for a model without priorities.
    pub policies: Vec<QueuePolicy>,
    /// The level of a request without a valid `priority` (1-based).
    pub default_level: u32,
    /// Whether the model has priority levels at all (Triton reports them).
    pub configured: bool,
    /// Executors that run level-1 requests only.
    pub reserved_executors: usize,
}

impl Default for Priorities {
    fn default() -> Self {
        Priorities {
            policies: vec![QueuePolicy::default()],
            default_level: 1,
            configured: false,
            reserved_executors: 0,
        }
    }
}

/// Where a request waits and what its level's policy does to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Its level, 1 the highest.
    pub level: u32,
    /// When it stops waiting: `Some` with `Reject` is a deadline, with
    /// `Delay` the time it moves behind every other request.
    pub timeout_at: Option<Instant>,
    /// What happens then.
    pub action: TimeoutAction,
}

impl Priorities {
    /// Checks `config`.
    pub fn resolve(config: &PriorityConfig) -> Result<Priorities, String> {
        let levels = config.priority_levels;
        if levels > MAX_LEVELS {
            return Err(format!("priority_levels is {levels}; at most {MAX_LEVELS}"));
        }
        let check = |key: &str, policy: &QueuePolicyConfig| -> Result<QueuePolicy, String> {
            if let Some(t) = policy.default_timeout {
                durations::check(key, t, MAX_TIMEOUT)?;
            }
            Ok(QueuePolicy {
                timeout_action: policy.timeout_action,
                timeout: policy.default_timeout,
                max_queue_size: policy.max_queue_size,
            })
        };
        let default_policy = check(
            "default_queue_policy.default_timeout",
            &config.default_queue_policy,
        )?;
        if levels == 0 {
            if config.default_priority_level.is_some_and(|l| l != 0)
                || !config.priority_queue_policy.is_empty()
                || config.reserved_executors > 0
            {
                return Err("default_priority_level, priority_queue_policy and \
                     reserved_executors need priority_levels"
                    .to_string());
            }
            return Ok(Priorities {
                policies: vec![default_policy],
                default_level: 1,
                configured: false,
                reserved_executors: 0,
            });
        }
        let default_level = config.default_priority_level.unwrap_or(levels);
        if !(1..=levels).contains(&default_level) {
            return Err(format!(
                "default_priority_level is {default_level}; the levels are 1 to {levels}"
            ));
        }
        let mut policies = vec![default_policy; levels as usize];
        for (key, policy) in &config.priority_queue_policy {
            let level = key
                .parse::<u32>()
                .ok()
                .filter(|l| (1..=levels).contains(l))
                .ok_or_else(|| {
                    format!("priority_queue_policy.{key}: the levels are 1 to {levels}")
                })?;
            policies[(level - 1) as usize] = check(
                &format!("priority_queue_policy.{key}.default_timeout"),
                policy,
            )?;
        }
        Ok(Priorities {
            policies,
            default_level,
            configured: true,
            reserved_executors: config.reserved_executors,
        })
    }

    /// The level a request's `priority` parameter picks: 0 or out of range
    /// is the default level.
    pub fn level(&self, priority: u64) -> u32 {
        match u32::try_from(priority) {
            Ok(p) if p >= 1 && (p as usize) <= self.policies.len() => p,
            _ => self.default_level,
        }
    }

    /// The lowest level (the highest number): where a shadow's copy of a
    /// request runs.
    pub fn lowest(&self) -> u32 {
        u32::try_from(self.policies.len())
            .unwrap_or(MAX_LEVELS)
            .max(1)
    }

    /// The policy of `level`.
    pub fn policy(&self, level: u32) -> QueuePolicy {
        self.policies
            .get(level.saturating_sub(1) as usize)
            .copied()
            .unwrap_or_default()
    }

    /// Where a request with `priority`, admitted at `admitted`, waits.
    pub fn place(&self, priority: u64, admitted: Instant) -> Placement {
        let level = self.level(priority);
        let policy = self.policy(level);
        Placement {
            level,
            timeout_at: policy
                .timeout
                .map(|t| durations::deadline_after(admitted, t)),
            action: policy.timeout_action,
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // instants of the machine's clock as test data
mod tests {
    use super::*;

    fn config(text: &str) -> PriorityConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn levels_resolve_with_the_default_policy_and_their_own() {
        let p = Priorities::resolve(&config(
            r#"
            priority_levels = 3
            default_priority_level = 2
            [default_queue_policy]
            max_queue_size = 10
            [priority_queue_policy.3]
            timeout_action = "delay"
            default_timeout = "2ms"
            "#,
        ))
        .unwrap();
        assert_eq!(p.policies.len(), 3);
        assert_eq!(p.policy(1).max_queue_size, 10);
        assert_eq!(p.policy(3).timeout_action, TimeoutAction::Delay);
        assert_eq!(p.policy(3).timeout, Some(Duration::from_millis(2)));
        assert_eq!(p.policy(3).max_queue_size, 0, "its own policy, whole");
        // Triton's rule: 0 or out of range is the default level.
        assert_eq!(
            (
                p.level(0),
                p.level(1),
                p.level(3),
                p.level(4),
                p.level(u64::MAX)
            ),
            (2, 1, 3, 2, 2)
        );
        let t0 = Instant::now();
        assert_eq!(
            p.place(3, t0).timeout_at,
            Some(t0 + Duration::from_millis(2))
        );
        assert_eq!(p.place(1, t0).timeout_at, None);
    }

    #[test]
    fn bad_settings_name_the_key() {
        for (text, words) in [
            ("priority_levels = 100", "at most 64"),
            ("priority_levels = 2\ndefault_priority_level = 3", "1 to 2"),
            (
                "priority_levels = 2\n[priority_queue_policy.5]\nmax_queue_size = 1",
                "priority_queue_policy.5",
            ),
            ("default_priority_level = 1", "need priority_levels"),
            (
                "priority_levels = 1\n[default_queue_policy]\ndefault_timeout = \"3h\"",
                "default_queue_policy.default_timeout",
            ),
        ] {
            let e = Priorities::resolve(&config(text)).unwrap_err();
            assert!(e.contains(words), "{text}: {e}");
        }
        assert!(
            toml::from_str::<PriorityConfig>(
                "priority_levels = 1\n[default_queue_policy]\ntimeout_action = \"drop\""
            )
            .is_err()
        );
    }

    #[test]
    fn without_levels_every_request_is_level_one() {
        let p = Priorities::resolve(&PriorityConfig::default()).unwrap();
        assert!(!p.configured);
        assert_eq!((p.level(0), p.level(1), p.level(7)), (1, 1, 1));
    }
}
