//! Draws from a counter: SplitMix64 (Steele, Lea and Flood, 2014), each draw a
//! function of its counter's value alone, so that one shared atomic counter
//! is all a spread of requests needs (the canary split's versions, a shadow's
//! fraction), and any run of draws takes its share.

/// SplitMix64's mix of state `n + γ`: for `n = k·γ` (wrapping), the
/// `k + 1`-th output of the generator seeded with 0.
pub(crate) fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Draw `n` as a number in [0, 1): the top 53 bits of its mix.
pub(crate) fn unit(n: u64) -> f64 {
    (splitmix64(n) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference generator's first outputs from seed 0, and a few more.
    #[test]
    fn the_mix_is_splitmix64() {
        const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(GAMMA), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(splitmix64(GAMMA.wrapping_mul(2)), 0x06c4_5d18_8009_454f);
        assert_eq!(splitmix64(1), 0x910a_2dec_8902_5cc1);
        assert_eq!(splitmix64(12_345), 0x2211_8258_a9d1_11a0);
    }

    #[test]
    fn a_unit_draw_is_the_top_53_bits() {
        assert_eq!(
            unit(0),
            (0xe220_a839_7b1d_cdafu64 >> 11) as f64 / 9_007_199_254_740_992.0
        );
        assert!((0..10_000).all(|n| (0.0..1.0).contains(&unit(n))));
    }
}
