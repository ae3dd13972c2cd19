//! Buffers and byte views: the runtime's aligned storage, and tensors seen as the bytes the
//! kernels read and write. The one place that reaches into [`Data`]'s vectors.

use tcc_ir::{DType, Data, Tensor, TensorType, each_data};

/// 64 bytes, 64-byte aligned: the unit of every buffer the runtime and the GEMM allocate, so
/// that vector loads never split a cache line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub(super) struct Line([u8; 64]);

/// Zeroed, 64-byte-aligned storage of at least `bytes` bytes.
pub(super) fn lines(bytes: u64) -> Vec<Line> {
    vec![Line([0; 64]); bytes.div_ceil(64) as usize]
}

/// A working buffer of at least `bytes`, `buf` reused where it is large enough (what it held is
/// not kept otherwise): its first byte.
pub(super) fn at_least(buf: &mut Vec<Line>, bytes: usize) -> *mut u8 {
    if buf.len() * 64 < bytes {
        *buf = lines(bytes as u64);
    }
    buf.as_mut_ptr() as *mut u8
}

/// `buf` as `f32`s (every `Line` is sixteen of them).
pub(super) fn line_floats(buf: &mut [Line]) -> &mut [f32] {
    // SAFETY: `Line` is 64 plain bytes aligned to 64, and every bit pattern is a valid `f32`.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut f32, buf.len() * 16) }
}

/// Copies `t`'s elements to `dst`.
///
/// # Safety
/// `dst` must point at `t.ty().size_bytes()` writable bytes that overlap nothing `t` owns.
pub(super) unsafe fn write_data(dst: *mut u8, t: &Tensor) {
    let bytes = t.view().bytes();
    // SAFETY: the caller's contract covers `dst` for the tensor's bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) }
}

/// Copies a tensor of type `ty` out of memory at `src`. Booleans are read as `byte != 0`.
///
/// # Safety
/// `src` must point at `ty.size_bytes()` readable bytes holding valid elements of `ty`, aligned
/// for its dtype.
pub(super) unsafe fn read_data(src: *const u8, ty: &TensorType) -> Tensor {
    let n = ty.numel() as usize;
    let data = if ty.dtype() == DType::Bool {
        // SAFETY: the caller's contract; any byte is a valid `u8`.
        let bytes = unsafe { std::slice::from_raw_parts(src, n) };
        Data::Bool(bytes.iter().map(|&b| b != 0).collect())
    } else {
        let mut d = Data::with_capacity(ty.dtype(), n);
        // SAFETY: `d` has room for `n` elements of the dtype, which `src` holds (the caller's
        // contract); every bit pattern is a valid number.
        unsafe {
            std::ptr::copy_nonoverlapping(src, capacity_ptr(&mut d), ty.size_bytes() as usize);
            set_len(&mut d, n);
        }
        d
    };
    Tensor::new(ty.clone(), data).expect("sized from the type")
}

/// The start of `d`'s allocation (its capacity), to be written through.
pub(super) fn capacity_ptr(d: &mut Data) -> *mut u8 {
    each_data!(d, v => v.as_mut_ptr().cast())
}

/// Sets the length of `d`'s vector.
///
/// # Safety
/// The first `n` elements (within capacity) must have been initialised with valid values.
pub(super) unsafe fn set_len(d: &mut Data, n: usize) {
    // SAFETY: the caller's contract.
    each_data!(d, v => unsafe { v.set_len(n) })
}

/// Asks the kernel to back `len` bytes at `ptr` with transparent huge pages, so that a large
/// fresh buffer takes a few page faults instead of one per 4 KiB. Only a hint; no effect on small
/// buffers or other systems.
pub(super) fn advise_huge_pages(ptr: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if len >= 2 * HUGE {
            let start = (ptr as usize).next_multiple_of(4096);
            let end = (ptr as usize + len) & !4095;
            // SAFETY: the range lies inside one live allocation; MADV_HUGEPAGE changes only how
            // it is backed, never its contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}
