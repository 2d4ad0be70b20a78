//! Copying bytes at memory's speed whatever the two buffers' relative alignment.
//!
//! glibc copies mid-sized buffers (above about 2 KiB, below about half a MiB) with `rep movsb`.
//! On some CPUs that instruction is fast only when the destination and the source sit at the
//! same offset within 32 bytes: on an AMD EPYC VM a 64 KiB copy whose destination lies 1–31
//! bytes past the source (modulo a page) ran at 3 GB/s against 50, and 33–63 bytes past at
//! 9–37 (bench/RESULTS.md "Copies whose buffers are not aligned alike"). Buffers handed to a
//! collective, the slots of a connection and the windows of a message fall at every offset, so
//! [`copy`] moves such copies to a vector loop that runs at full speed at every offset, and
//! leaves the rest to the C library (whose non-temporal stores serve the large ones).

/// Below this many bytes the C library does not use `rep movsb`.
const VECTOR_FROM: usize = 2048;
/// From this many bytes on the C library uses non-temporal stores instead (its threshold
/// depends on the cache size; half a MiB or more on the machines measured).
const VECTOR_BELOW: usize = 512 << 10;

/// Copy `src` into `dst`, which must be the same length (as `copy_from_slice`).
#[inline]
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy between buffers of different lengths");
    let n = dst.len();
    let skew = (dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) % 32;
    if skew != 0 && (VECTOR_FROM..VECTOR_BELOW).contains(&n) && vector::available() {
        vector::copy(dst, src);
    } else {
        dst.copy_from_slice(src);
    }
}

#[cfg(target_arch = "x86_64")]
mod vector {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_store_si256, _mm256_storeu_si256};

    /// Whether the CPU has AVX2 (detected once; the macro caches it).
    #[inline]
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    /// Copy with 32-byte loads and 32-byte stores aligned on the destination.
    pub fn copy(dst: &mut [u8], src: &[u8]) {
        assert!(dst.len() == src.len() && dst.len() >= 64 && available());
        // SAFETY: the CPU has AVX2 (checked above), the lengths are equal and at least 64, and
        // `dst` (a `&mut`) cannot overlap `src`.
        unsafe { copy_avx2(dst.as_mut_ptr(), src.as_ptr(), dst.len()) }
    }

    /// # Safety
    /// AVX2 must be available; `d` and `s` must be valid for `n >= 64` bytes and not overlap.
    #[target_feature(enable = "avx2")]
    unsafe fn copy_avx2(d: *mut u8, s: *const u8, n: usize) {
        // SAFETY: every access lies within [0, n) of its buffer: the head and the tail are the
        // first and last 32 bytes (n >= 64), and the loops stop 32 or 128 bytes before n;
        // stores in the loops are at `d + i` with `i` advanced to a multiple of 32 from `d`'s
        // alignment, so aligned stores are aligned. The caller guarantees AVX2 and validity.
        unsafe {
            let head = _mm256_loadu_si256(s.cast::<__m256i>());
            let tail = _mm256_loadu_si256(s.add(n - 32).cast::<__m256i>());
            let mut i = 32 - (d as usize) % 32;
            while i + 128 <= n {
                let a = _mm256_loadu_si256(s.add(i).cast::<__m256i>());
                let b = _mm256_loadu_si256(s.add(i + 32).cast::<__m256i>());
                let c = _mm256_loadu_si256(s.add(i + 64).cast::<__m256i>());
                let e = _mm256_loadu_si256(s.add(i + 96).cast::<__m256i>());
                _mm256_store_si256(d.add(i).cast::<__m256i>(), a);
                _mm256_store_si256(d.add(i + 32).cast::<__m256i>(), b);
                _mm256_store_si256(d.add(i + 64).cast::<__m256i>(), c);
                _mm256_store_si256(d.add(i + 96).cast::<__m256i>(), e);
                i += 128;
            }
            while i + 32 <= n {
                _mm256_store_si256(d.add(i).cast::<__m256i>(), _mm256_loadu_si256(s.add(i).cast::<__m256i>()));
                i += 32;
            }
            _mm256_storeu_si256(d.cast::<__m256i>(), head);
            _mm256_storeu_si256(d.add(n - 32).cast::<__m256i>(), tail);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod vector {
    pub fn available() -> bool {
        false
    }
    pub fn copy(dst: &mut [u8], src: &[u8]) {
        dst.copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(i: usize) -> u8 {
        (i * 131 + 17) as u8
    }

    #[test]
    fn every_byte_is_copied_at_every_length_and_offset() {
        let src: Vec<u8> = (0..VECTOR_FROM * 3 + 300).map(value).collect();
        let mut dst = vec![0u8; src.len() + 128];
        for s_off in [0, 1, 8, 31, 32, 33] {
            for d_off in [0, 1, 5, 16, 32, 40, 63] {
                for len in [
                    0,
                    1,
                    63,
                    64,
                    65,
                    VECTOR_FROM - 1,
                    VECTOR_FROM,
                    VECTOR_FROM + 1,
                    VECTOR_FROM + 127,
                    3 * VECTOR_FROM,
                ] {
                    dst.fill(0xee);
                    copy(&mut dst[d_off..d_off + len], &src[s_off..s_off + len]);
                    assert_eq!(&dst[d_off..d_off + len], &src[s_off..s_off + len], "{s_off} {d_off} {len}");
                    assert!(
                        dst[..d_off].iter().chain(&dst[d_off + len..]).all(|&b| b == 0xee),
                        "{s_off} {d_off} {len}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_vector_loop_copies_exactly_when_called_directly() {
        if !vector::available() {
            return;
        }
        let src: Vec<u8> = (0..5000).map(value).collect();
        let mut dst = vec![0u8; 5100];
        for (d_off, len) in [(0, 64), (7, 64), (31, 100), (1, 4999 - 32), (33, 4096)] {
            dst.fill(0);
            vector::copy(&mut dst[d_off..d_off + len], &src[..len]);
            assert_eq!(&dst[d_off..d_off + len], &src[..len]);
            assert!(dst[..d_off].iter().chain(&dst[d_off + len..]).all(|&b| b == 0));
        }
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn buffers_of_different_lengths_are_refused() {
        copy(&mut [0u8; 8], &[0u8; 9]);
    }
}
