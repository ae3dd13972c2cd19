//! The layout changes `to_nchwc` and `from_nchwc`: `[N, C, S]` to and from `[N, C/b, S, b]`
//! (`S` the spatial positions). For f32 in blocks of eight with AVX2 each step moves an 8x8
//! square through registers (eight channel rows in, eight pixels out, or back); anything else
//! copies element by element. The padding lanes of a blocked result are zero.

use crate::cpu::send_ptr::SendPtr;
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::{first, transpose};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One layout change.
pub(super) struct Reorder {
    /// `to_nchwc` (else `from_nchwc`).
    pub to_blocked: bool,
    /// Images, channels, spatial positions, channels per block.
    pub n: usize,
    pub c: usize,
    pub s: usize,
    pub b: usize,
    /// Bytes per element.
    pub size: usize,
    /// Whether the f32 8x8 kernel may run (f32, b = 8, the target has AVX2).
    pub wide: bool,
}

impl Reorder {
    /// Moves the tensor at `src` into the other layout at `dst`.
    ///
    /// # Safety
    /// `src` and `dst` hold the operand and the result, and do not overlap.
    pub(super) unsafe fn run(&self, src: *const u8, dst: *mut u8) {
        let (s, b) = (self.s, self.b);
        let cb = self.c.div_ceil(b);
        // One block of one image is one plane of the blocked tensor: `s * b` elements.
        let plane = s * b;
        if self.n * cb * plane == 0 {
            return;
        }
        if self.wide {
            // One block of one image at a time, in parallel when large.
            let (blocked, plain) = if self.to_blocked {
                (dst as *mut f32, src as *mut f32)
            } else {
                (src as *mut f32, dst as *mut f32)
            };
            // SAFETY: each block plane of the blocked tensor, and the channel rows of the plain
            // one its block covers, are touched by one job only; the side read is not written.
            let (blocked, plain) = unsafe { (SendPtr::new(blocked), SendPtr::new(plain)) };
            let work = |i: usize| {
                let (img, blk) = (i / cb, i % cb);
                let cn = b.min(self.c - blk * b);
                // SAFETY: plane i of the blocked tensor and the block's channel rows of image
                // img; `wide` means f32, b = 8 and AVX2.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    let plane = blocked.get().add(i * plane);
                    let rows = plain.get().add((img * self.c + blk * b) * s);
                    if self.to_blocked {
                        block8(rows, s, cn, plane)
                    } else {
                        unblock8(plane, s, cn, rows)
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (img, cn, blocked, plain);
            };
            if self.n * cb * plane >= 1 << 14 {
                crate::cpu::pool::for_each(self.n * cb, &work);
            } else {
                (0..self.n * cb).for_each(work);
            }
            return;
        }
        let size = self.size;
        for img in 0..self.n {
            for blk in 0..cb {
                for p in 0..s {
                    for l in 0..b {
                        let ch = blk * b + l;
                        let at_b = (((img * cb + blk) * s + p) * b + l) * size;
                        // SAFETY: both offsets lie inside their tensors.
                        unsafe {
                            if ch >= self.c {
                                if self.to_blocked {
                                    std::ptr::write_bytes(dst.add(at_b), 0, size);
                                }
                                continue;
                            }
                            let at_p = ((img * self.c + ch) * s + p) * size;
                            let (from, to) = if self.to_blocked {
                                (at_p, at_b)
                            } else {
                                (at_b, at_p)
                            };
                            std::ptr::copy_nonoverlapping(src.add(from), dst.add(to), size);
                        }
                    }
                }
            }
        }
    }
}

/// Channel rows `rows` (`cn <= 8` of them, `s` floats each, one after another) into the block
/// plane `out` (`s` pixels of eight floats; lanes past `cn` zero).
///
/// # Safety
/// The CPU has AVX2; `rows` holds `cn * s` floats, `out` `8 * s` that nothing else touches
/// meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block8(rows: *const f32, s: usize, cn: usize, out: *mut f32) {
    for p0 in (0..s).step_by(8) {
        let m = 8.min(s - p0);
        let mut v = [_mm256_setzero_ps(); 8];
        for (l, v) in v.iter_mut().enumerate().take(cn) {
            // SAFETY: floats p0..p0+m of row l (masked only for a partial last vector).
            *v = unsafe {
                if m == 8 {
                    _mm256_loadu_ps(rows.add(l * s + p0))
                } else {
                    _mm256_maskload_ps(rows.add(l * s + p0), first(m))
                }
            };
        }
        transpose(&mut v);
        for (j, v) in v.iter().enumerate().take(m) {
            // SAFETY: pixel p0 + j < s of the plane.
            unsafe { _mm256_storeu_ps(out.add((p0 + j) * 8), *v) };
        }
    }
}

/// The block plane `plane` (`s` pixels of eight floats) into channel rows `rows` (the first
/// `cn` lanes, `s` floats each).
///
/// # Safety
/// The CPU has AVX2; `plane` holds `8 * s` floats, `rows` `cn * s` that nothing else touches
/// meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn unblock8(plane: *const f32, s: usize, cn: usize, rows: *mut f32) {
    for p0 in (0..s).step_by(8) {
        let m = 8.min(s - p0);
        let mut v = [_mm256_setzero_ps(); 8];
        for (j, v) in v.iter_mut().enumerate().take(m) {
            // SAFETY: pixel p0 + j < s of the plane.
            *v = unsafe { _mm256_loadu_ps(plane.add((p0 + j) * 8)) };
        }
        transpose(&mut v);
        for (l, v) in v.iter().enumerate().take(cn) {
            // SAFETY: floats p0..p0+m of row l (a masked store, slow on some CPUs, only for a
            // partial last vector).
            unsafe {
                if m == 8 {
                    _mm256_storeu_ps(rows.add(l * s + p0), *v)
                } else {
                    _mm256_maskstore_ps(rows.add(l * s + p0), first(m), *v)
                }
            };
        }
    }
}
