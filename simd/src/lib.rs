//! # oxccl-simd: host-memory kernels that need CPU intrinsics
//!
//! The core crate forbids `unsafe`; what needs it to reach memory's speed lives here.
//!
//! [`stream_fill`] writes a large destination that nothing will read soon (an out-of-place
//! result) with non-temporal stores. A plain store to a line that is not in cache first reads the
//! line (read for ownership): three memory transfers per byte written instead of two. The
//! caller computes each tile into a small cache-resident buffer, and the buffer goes to the
//! destination with streaming stores, which skip that read.
//!
//! [`copy()`] copies at memory's speed whatever the two buffers' offsets, where the C library's
//! `rep movsb` runs at a fraction of it (a destination 1–31 bytes past its source).
//!
//! [`clock::now`] reads the time-stamp counter for the per-operation times of small calls,
//! where `clock_gettime`'s fenced read costs a cross-core miss.
#![warn(missing_docs)]

pub mod clock;
mod copy;

pub use copy::copy;

/// Bytes per tile: small enough that the tile stays in L1 between being computed and streamed
/// (4 KiB: with 1 KiB tiles the per-tile call into the reduction kernel cost more than the
/// stores saved, see bench/RESULTS.md).
pub const TILE: usize = 4096;

/// Fill `dst` tile by tile: `fill(off, tile)` must write the value of `dst[off..off +
/// tile.len()]` into `tile`. Tiles are whole multiples of `unit` bytes (the element size; it
/// must divide [`TILE`]). Where the CPU has streaming stores and `dst` is `unit`-aligned, whole
/// aligned tiles are stored with them (and fenced before returning, so the result is ordered
/// before any later release store, as plain stores are); the unaligned head and the tail, and
/// everything elsewhere, are copied plainly. The result is the same either way.
pub fn stream_fill(dst: &mut [u8], unit: usize, fill: &mut dyn FnMut(usize, &mut [u8])) {
    assert!(unit > 0 && TILE % unit == 0, "unit {unit} does not divide the tile");
    let mut tile = Tile([0; TILE]);
    let align = store::ALIGN;
    let addr = dst.as_ptr() as usize;
    let head = (align - addr % align) % align;
    if !store::available() || addr % unit != 0 || dst.len() < head + TILE {
        plain(dst, 0, &mut tile.0, fill);
        return;
    }
    let body = (dst.len() - head) / TILE * TILE;
    let (front, rest) = dst.split_at_mut(head);
    let (middle, back) = rest.split_at_mut(body);
    plain(front, 0, &mut tile.0, fill);
    for (i, d) in middle.chunks_exact_mut(TILE).enumerate() {
        fill(head + i * TILE, &mut tile.0);
        store::stream(d, &tile.0);
    }
    store::fence();
    plain(back, head + body, &mut tile.0, fill);
}

/// A tile aligned for the widest streaming store.
#[repr(C, align(64))]
struct Tile([u8; TILE]);

/// `fill` through the tile into `dst` with plain copies; `base` is `dst`'s offset in the whole.
fn plain(dst: &mut [u8], base: usize, tile: &mut [u8; TILE], fill: &mut dyn FnMut(usize, &mut [u8])) {
    for (i, d) in dst.chunks_mut(TILE).enumerate() {
        let t = &mut tile[..d.len()];
        fill(base + i * TILE, t);
        copy(d, t);
    }
}

#[cfg(target_arch = "x86_64")]
mod store {
    use std::arch::x86_64::{__m128i, __m256i, _mm256_load_si256, _mm256_stream_si256, _mm_load_si128};
    use std::arch::x86_64::{_mm_sfence, _mm_stream_si128};

    /// Alignment streaming stores need (AVX's 32 bytes covers SSE2's 16).
    pub const ALIGN: usize = 32;

    /// SSE2 is part of x86-64, so streaming stores always exist.
    pub fn available() -> bool {
        true
    }

    /// Store `src` (64-byte aligned, the tile) to `dst` (32-byte aligned, same length, a
    /// multiple of 32) with non-temporal stores.
    pub fn stream(dst: &mut [u8], src: &[u8; super::TILE]) {
        assert!(dst.len() == src.len() && dst.as_ptr() as usize % ALIGN == 0);
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: AVX was detected at run time; the lengths and alignments were checked.
            unsafe { stream_avx(dst, src) }
        } else {
            // SAFETY: SSE2 is baseline on x86-64; lengths and alignments were checked.
            unsafe { stream_sse2(dst, src) }
        }
    }

    #[target_feature(enable = "avx")]
    unsafe fn stream_avx(dst: &mut [u8], src: &[u8; super::TILE]) {
        let (d, s) = (dst.as_mut_ptr() as *mut __m256i, src.as_ptr() as *const __m256i);
        for k in 0..super::TILE / 32 {
            // SAFETY: k * 32 + 32 <= TILE = dst.len(); both pointers are 32-byte aligned.
            unsafe { _mm256_stream_si256(d.add(k), _mm256_load_si256(s.add(k))) }
        }
    }

    unsafe fn stream_sse2(dst: &mut [u8], src: &[u8; super::TILE]) {
        let (d, s) = (dst.as_mut_ptr() as *mut __m128i, src.as_ptr() as *const __m128i);
        for k in 0..super::TILE / 16 {
            // SAFETY: k * 16 + 16 <= TILE = dst.len(); both pointers are 16-byte aligned.
            unsafe { _mm_stream_si128(d.add(k), _mm_load_si128(s.add(k))) }
        }
    }

    /// Order the streaming stores before every later store.
    pub fn fence() {
        // SAFETY: sfence has no preconditions (SSE, baseline on x86-64).
        unsafe { _mm_sfence() }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod store {
    pub const ALIGN: usize = 1;
    pub fn available() -> bool {
        false
    }
    pub fn stream(dst: &mut [u8], src: &[u8; super::TILE]) {
        dst.copy_from_slice(src);
    }
    pub fn fence() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(i: usize) -> u8 {
        (i * 31 + 7) as u8
    }

    #[test]
    fn every_byte_is_written_at_every_length_and_alignment() {
        let mut buf = vec![0u8; 3 * TILE + 200];
        for start in [0, 1, 4, 8, 16, 31, 32, 33] {
            for len in [0, 1, 31, 32, 100, TILE - 1, TILE, TILE + 1, 2 * TILE + 37, 3 * TILE] {
                buf.fill(0xee);
                let d = &mut buf[start..start + len];
                let mut seen = 0;
                stream_fill(d, 1, &mut |off, t| {
                    t.iter_mut().enumerate().for_each(|(i, b)| *b = value(off + i));
                    seen += t.len();
                });
                assert_eq!(seen, len, "start {start} len {len}");
                assert!(d.iter().enumerate().all(|(i, &b)| b == value(i)), "start {start} len {len}");
                assert!(buf[..start].iter().all(|&b| b == 0xee));
                assert!(buf[start + len..].iter().all(|&b| b == 0xee));
            }
        }
    }

    #[test]
    fn tiles_are_whole_elements() {
        let mut buf = vec![0u8; 4 * TILE + 64];
        for start in [0, 4, 8, 12, 28, 36] {
            let d = &mut buf[start..start + 3 * TILE + 20];
            stream_fill(d, 4, &mut |off, t| {
                assert!(off % 4 == 0 && t.len() % 4 == 0, "off {off} len {}", t.len());
                t.fill(1);
            });
            assert!(d.iter().all(|&b| b == 1));
        }
    }

    #[test]
    #[should_panic(expected = "does not divide")]
    fn a_unit_that_does_not_divide_the_tile_is_refused() {
        stream_fill(&mut [0u8; 8], 3, &mut |_, _| {});
    }
}
