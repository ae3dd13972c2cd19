//! Data movement of any dtype, as byte copies of contiguous runs: transposes, slices,
//! concatenations and gathers.

use tcc_ir::DType;

/// A strided slice as copies of contiguous runs: the trailing axes the slice takes whole merge
/// into one block, so slicing channels of NCHW copies one run per image.
pub(super) struct SliceCopy {
    /// Per outer axis (those before the innermost sliced one): count and input stride, in bytes.
    outer: Vec<(usize, usize)>,
    /// Input byte offset of the first element.
    start: usize,
    /// Runs per outer index, the input stride between them and each run's bytes.
    runs: usize,
    run_stride: usize,
    run_bytes: usize,
}

impl SliceCopy {
    pub(super) fn new(
        dims: &[usize],
        starts: &[i64],
        ends: &[i64],
        steps: &[i64],
        size: usize,
    ) -> SliceCopy {
        let r = dims.len();
        let mut stride = vec![size; r];
        for i in (0..r.saturating_sub(1)).rev() {
            stride[i] = stride[i + 1] * dims[i + 1];
        }
        let axes: Vec<(usize, usize, i64)> = (0..r)
            .map(|i| {
                let step = steps.get(i).copied().unwrap_or(1);
                let (s, n) = tcc_ir::typing::slice_range(dims[i] as u64, starts[i], ends[i], step);
                (s.max(0) as usize, n as usize, step)
            })
            .collect();
        let start: usize = axes.iter().zip(&stride).map(|(a, st)| a.0 * st).sum();
        // The innermost axis not taken whole; everything after it is one block.
        let k = (0..r).rev().find(|&i| axes[i] != (0, dims[i], 1));
        let Some(k) = k else {
            let bytes = dims.iter().product::<usize>() * size;
            return SliceCopy {
                outer: Vec::new(),
                start: 0,
                runs: 1,
                run_stride: 0,
                run_bytes: bytes,
            };
        };
        let block = stride[k];
        let (_, count, step) = axes[k];
        let (runs, run_stride, run_bytes) = if step == 1 {
            (1, 0, count * block)
        } else {
            (count, (step as isize as usize).wrapping_mul(block), block)
        };
        SliceCopy {
            outer: (0..k)
                .map(|i| {
                    (
                        axes[i].1,
                        (axes[i].2 as isize as usize).wrapping_mul(stride[i]),
                    )
                })
                .collect(),
            start,
            runs,
            run_stride,
            run_bytes,
        }
    }

    /// Copies the slice of `src` to `dst`.
    ///
    /// # Safety
    /// `src` holds the sliced tensor and `dst` the result; they do not overlap.
    pub(super) unsafe fn run(&self, src: *const u8, dst: *mut u8) {
        let total: usize = self.outer.iter().map(|o| o.0).product();
        if total == 0 || self.runs == 0 || self.run_bytes == 0 {
            return;
        }
        let mut idx = vec![0usize; self.outer.len()];
        let mut from = self.start;
        let mut to = 0usize;
        for _ in 0..total {
            let mut at = from;
            for _ in 0..self.runs {
                // SAFETY: the offsets stay inside the tensors: they walk the slice's elements
                // (negative steps wrap `usize` and wrap back, as two's complement does).
                unsafe {
                    std::ptr::copy_nonoverlapping(src.add(at), dst.add(to), self.run_bytes);
                }
                at = at.wrapping_add(self.run_stride);
                to += self.run_bytes;
            }
            for ax in (0..idx.len()).rev() {
                let (n, st) = self.outer[ax];
                idx[ax] += 1;
                from = from.wrapping_add(st);
                if idx[ax] < n {
                    break;
                }
                from = from.wrapping_sub(st.wrapping_mul(n));
                idx[ax] = 0;
            }
        }
    }
}

/// Copies a `dims` tensor of `size`-byte elements into its transpose by `perm`.
///
/// # Safety
/// `src` and `dst` hold the tensor and its transpose and do not overlap.
pub(super) unsafe fn transpose(
    src: *const u8,
    dst: *mut u8,
    dims: &[usize],
    perm: &[usize],
    size: usize,
) {
    let r = dims.len();
    let mut st = vec![1usize; r];
    for i in (0..r.saturating_sub(1)).rev() {
        st[i] = st[i + 1] * dims[i + 1];
    }
    // Output axis i walks input axis perm[i].
    let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let os: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let total: usize = dims.iter().product();
    if total == 0 {
        return;
    }
    let mut idx = vec![0usize; r];
    let mut src_off = 0usize;
    for o in 0..total {
        // SAFETY: src_off < total and o < total index elements of the two buffers.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(src_off * size), dst.add(o * size), size);
        }
        for ax in (0..r).rev() {
            idx[ax] += 1;
            src_off += os[ax];
            if idx[ax] < od[ax] {
                break;
            }
            src_off -= os[ax] * od[ax];
            idx[ax] = 0;
        }
    }
}

/// `concat`: each of `outer` rows of `dst` is the sources' rows side by side, source `i`'s row
/// `row_bytes[i]` long.
///
/// # Safety
/// Each source holds `outer * row_bytes[i]` bytes and `dst` the sum; they do not overlap.
pub(super) unsafe fn concat(srcs: &[*const u8], dst: *mut u8, outer: usize, row_bytes: &[usize]) {
    let total: usize = row_bytes.iter().sum();
    let mut at = 0;
    for (&src, &row) in srcs.iter().zip(row_bytes) {
        for o in 0..outer {
            // SAFETY: the caller's contract; row o of source i, to its place in row o of dst.
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(o * row), dst.add(o * total + at), row)
            };
        }
        at += row;
    }
}

/// `gather` (`take` along an axis): for each of `outer` rows of `len` blocks of `block_bytes`,
/// the blocks the `count` indices (`i32` or `i64`, negative counting from the end) name.
///
/// # Safety
/// `src` holds `outer * len` blocks, `ids` `count` indices of `indices`' dtype, and `dst`
/// `outer * count` blocks; `dst` overlaps neither.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gather(
    src: *const u8,
    ids: *const u8,
    dst: *mut u8,
    indices: DType,
    count: usize,
    outer: usize,
    len: usize,
    block_bytes: usize,
) -> Result<(), String> {
    let rows: Vec<usize> = (0..count)
        .map(|j| {
            // SAFETY: j < count (the caller's contract).
            let i = unsafe {
                match indices {
                    DType::I32 => *(ids as *const i32).add(j) as i64,
                    _ => *(ids as *const i64).add(j),
                }
            };
            let k = if i < 0 { i + len as i64 } else { i };
            usize::try_from(k)
                .ok()
                .filter(|&k| k < len)
                .ok_or_else(|| format!("index {i} is out of range for an axis of size {len}"))
        })
        .collect::<Result<_, _>>()?;
    let mut to = 0;
    for o in 0..outer {
        for &k in &rows {
            let from = (o * len + k) * block_bytes;
            // SAFETY: k < len, so the block is inside src; `to` walks dst's blocks in order.
            unsafe { std::ptr::copy_nonoverlapping(src.add(from), dst.add(to), block_bytes) };
            to += block_bytes;
        }
    }
    Ok(())
}
