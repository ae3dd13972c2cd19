//! Data movement of any dtype, as byte copies of contiguous runs: transposes, slices,
//! concatenations and gathers.

use crate::cpu::send_ptr::SendPtr;
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
/// Axes of size 1 are dropped and axes that stay next to each other in the same order are
/// merged, so a transpose is reduced to the few axes that really move. If the innermost axis
/// stays innermost, the copy is of contiguous runs; otherwise the innermost input and output
/// axes are copied in square tiles, so that reads and writes both stay within a few cache
/// lines. Large transposes split their outermost axis across threads.
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
    let total: usize = dims.iter().product();
    if total == 0 {
        return;
    }
    let (dims, perm) = simplify(dims, perm);
    let r = dims.len();
    if r <= 1 {
        // SAFETY: the caller's contract; nothing moves.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, total * size) };
        return;
    }
    let mut st = vec![1usize; r];
    for i in (0..r - 1).rev() {
        st[i] = st[i + 1] * dims[i + 1];
    }
    // Output axis i walks input axis perm[i], with input stride os[i] (elements); the output's
    // own strides are ost.
    let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let os: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let mut ost = vec![1usize; r];
    for i in (0..r - 1).rev() {
        ost[i] = ost[i + 1] * od[i + 1];
    }
    let t = Transpose {
        od,
        os,
        ost,
        inner_in: perm
            .iter()
            .position(|&p| p == r - 1)
            .expect("a permutation"),
        size,
    };
    // SAFETY (both): the caller's contract.
    let (src, dst) = unsafe { (SendPtr::new(src), SendPtr::new(dst)) };
    // SAFETY: jobs cover disjoint ranges of the output's outermost axis.
    let job = |lo: usize, hi: usize| unsafe { t.copy(src.get(), dst.get(), lo..hi) };
    split_rows(t.od[0], total * size, 2, &job);
}

/// Runs `job(lo, hi)` over rows `0..rows` of a copy of `bytes` bytes: in `per` ranges a thread
/// among the pool's threads when the copy is 256 KiB or more and has several rows, else at
/// once on this thread.
fn split_rows(rows: usize, bytes: usize, per: usize, job: &(dyn Fn(usize, usize) + Sync)) {
    let threads = crate::cpu::pool::threads();
    if bytes >= 1 << 18 && threads > 1 && rows > 1 {
        let chunk = rows.div_ceil(threads * per);
        crate::cpu::pool::for_each(rows.div_ceil(chunk), &|i| {
            job(i * chunk, ((i + 1) * chunk).min(rows))
        });
    } else {
        job(0, rows);
    }
}

/// `dims` and `perm` without axes of size 1 and with neighbouring axes that stay neighbours
/// merged.
fn simplify(dims: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // Keep the axes of size > 1, renumbered.
    let keep: Vec<usize> = (0..dims.len()).filter(|&a| dims[a] != 1).collect();
    let renum = |a: usize| keep.iter().position(|&k| k == a);
    let perm: Vec<usize> = perm.iter().filter_map(|&p| renum(p)).collect();
    let dims: Vec<usize> = keep.iter().map(|&a| dims[a]).collect();
    // Merge output-consecutive axes that are input-consecutive too: groups of input axes.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &p in &perm {
        match groups.last_mut() {
            Some(g) if *g.last().expect("non-empty") + 1 == p => g.push(p),
            _ => groups.push(vec![p]),
        }
    }
    // Each group becomes one input axis; number them in input order.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| groups[g][0]);
    let new_dims: Vec<usize> = order
        .iter()
        .map(|&g| groups[g].iter().map(|&a| dims[a]).product())
        .collect();
    let new_perm: Vec<usize> = (0..groups.len())
        .map(|g| order.iter().position(|&o| o == g).expect("a group"))
        .collect();
    (new_dims, new_perm)
}

/// A simplified transpose of two or more axes, by output axis: sizes `od`, input strides `os`,
/// output strides `ost` (elements); `inner_in` is the output axis that reads the input's
/// innermost one.
struct Transpose {
    od: Vec<usize>,
    os: Vec<usize>,
    ost: Vec<usize>,
    inner_in: usize,
    size: usize,
}

impl Transpose {
    /// Copies the output elements whose outermost index lies in `outer`. If the innermost axis
    /// stays innermost, as contiguous runs; otherwise the output's innermost axis and the one
    /// reading the input's innermost are copied in square tiles, the other axes one after
    /// another.
    ///
    /// # Safety
    /// As for [`transpose`].
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, outer: std::ops::Range<usize>) {
        const T: usize = 16;
        let (od, os, ost, size) = (&self.od, &self.os, &self.ost, self.size);
        let r = od.len();
        let range = |a: usize| if a == 0 { outer.clone() } else { 0..od[a] };
        let (inner_out, inner_in) = (r - 1, self.inner_in);
        let runs = inner_in == inner_out;
        // The axes walked one element at a time: all but the innermost two for runs (the
        // second innermost is the tight loop over runs below), else all but the two tiled.
        let others: Vec<usize> = (0..r)
            .filter(|&a| {
                if runs {
                    a < r - 2
                } else {
                    a != inner_out && a != inner_in
                }
            })
            .collect();
        let count: usize = others.iter().map(|&a| range(a).len()).product();
        let mut idx: Vec<usize> = others.iter().map(|&a| range(a).start).collect();
        for _ in 0..count {
            let from: usize = others.iter().zip(&idx).map(|(&a, &i)| i * os[a]).sum();
            let to: usize = others.iter().zip(&idx).map(|(&a, &i)| i * ost[a]).sum();
            if runs {
                // Runs along the second innermost output axis: contiguous in the output, a
                // stride apart in the input (a blocked tensor's blocks, 32 bytes each, as
                // channels-last pixels: a call to `memcpy` per run took most of the time).
                let run = od[r - 1] * size;
                let (s_in, s_out) = (os[r - 2] * size, ost[r - 2] * size);
                // SAFETY (every copy): the caller's contract; each run lies in its tensor.
                let (src, dst) = unsafe { (src.add(from * size), dst.add(to * size)) };
                let copy = |j: usize| unsafe {
                    let (s, d) = (src.add(j * s_in), dst.add(j * s_out));
                    match run {
                        16 => (d as *mut [u8; 16]).write_unaligned(*(s as *const [u8; 16])),
                        32 => (d as *mut [u8; 32]).write_unaligned(*(s as *const [u8; 32])),
                        64 => (d as *mut [u8; 64]).write_unaligned(*(s as *const [u8; 64])),
                        _ => std::ptr::copy_nonoverlapping(s, d, run),
                    }
                };
                range(r - 2).for_each(copy);
            } else {
                // Element (a, b), a along `inner_in` and b along the output's innermost axis:
                // input at from + a * os[inner_in] (= a, the input's innermost) + b * os[b's],
                // output at to + a * ost[inner_in] + b.
                let (ra, rb) = (range(inner_in), range(inner_out));
                let (sa_in, sb_in, sa_out) = (os[inner_in], os[inner_out], ost[inner_in]);
                for a0 in ra.clone().step_by(T) {
                    for b0 in rb.clone().step_by(T) {
                        for a in a0..(a0 + T).min(ra.end) {
                            for b in b0..(b0 + T).min(rb.end) {
                                let i = from + a * sa_in + b * sb_in;
                                let o = to + a * sa_out + b;
                                // SAFETY: both lie inside their tensors (the caller's
                                // contract).
                                unsafe { copy_elem(src, dst, i, o, size) };
                            }
                        }
                    }
                }
            }
            for k in (0..idx.len()).rev() {
                idx[k] += 1;
                if idx[k] < range(others[k]).end {
                    break;
                }
                idx[k] = range(others[k]).start;
            }
        }
    }
}

/// Copies element `i` of `src` to element `o` of `dst`, `size` bytes each.
///
/// # Safety
/// Both elements lie inside their buffers.
#[inline(always)]
unsafe fn copy_elem(src: *const u8, dst: *mut u8, i: usize, o: usize, size: usize) {
    // SAFETY: the caller's contract; unaligned reads and writes of the element's width.
    unsafe {
        match size {
            4 => (dst as *mut u32)
                .add(o)
                .write_unaligned((src as *const u32).add(i).read_unaligned()),
            8 => (dst as *mut u64)
                .add(o)
                .write_unaligned((src as *const u64).add(i).read_unaligned()),
            1 => *dst.add(o) = *src.add(i),
            _ => std::ptr::copy_nonoverlapping(src.add(i * size), dst.add(o * size), size),
        }
    }
}

/// `concat`: each of `outer` rows of `dst` is the sources' rows side by side, source `i`'s row
/// `row_bytes[i]` long.
///
/// # Safety
/// Each source holds `outer * row_bytes[i]` bytes and `dst` the sum; a source overlaps `dst`
/// only by lying exactly at its place in it (one row: the memory plan wrote it there).
pub(super) unsafe fn concat(srcs: &[*const u8], dst: *mut u8, outer: usize, row_bytes: &[usize]) {
    let total: usize = row_bytes.iter().sum();
    let mut at = 0;
    for (&src, &row) in srcs.iter().zip(row_bytes) {
        // An operand the memory plan placed in the result is there already.
        if outer == 1 && std::ptr::eq(src, dst.wrapping_add(at)) {
            at += row;
            continue;
        }
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
    // SAFETY (both): the caller's contract.
    let (src, dst) = unsafe { (SendPtr::new(src as *mut u8), SendPtr::new(dst)) };
    let (blocks, threads) = (outer * count, crate::cpu::pool::threads());
    if threads > 1 && block_bytes >= 1 << 16 && blocks < 2 * threads {
        // A few large blocks (a tensor picked apart along its outer axis, as ViT's q, k and v,
        // 600 KB each, were one copy on one thread): each block's bytes cut into pieces of
        // whole cache lines, shared among the threads.
        let parts = (block_bytes >> 16).min(4 * threads);
        let piece = block_bytes.div_ceil(parts).next_multiple_of(64);
        crate::cpu::pool::for_each(blocks * parts, &|i| {
            let (b, at) = (i / parts, (i % parts) * piece);
            let (o, j) = (b / count, b % count);
            if at < block_bytes {
                let from = (o * len + rows[j]) * block_bytes + at;
                // SAFETY: every index is below len, so the block is inside src; bytes at.. of
                // output block b are this item's.
                unsafe {
                    let to = dst.get().add(b * block_bytes + at);
                    let n = piece.min(block_bytes - at);
                    std::ptr::copy_nonoverlapping(src.get().add(from) as *const u8, to, n);
                }
            }
        });
        return Ok(());
    }
    // Rows `lo..hi` of the output; blocks of one element (a nearest-neighbour resize along the
    // last axis, as exporters write it) are copied as values, not through `memcpy` calls.
    let job = |lo: usize, hi: usize| {
        let (src, dst) = (src.get() as *const u8, dst.get());
        // SAFETY: every k < len, so each block is inside src; rows lo..hi of dst are this
        // job's.
        unsafe {
            match block_bytes {
                1 => take_rows::<u8>(src, dst, &rows, len, lo..hi),
                2 => take_rows::<u16>(src, dst, &rows, len, lo..hi),
                4 => take_rows::<u32>(src, dst, &rows, len, lo..hi),
                8 => take_rows::<u64>(src, dst, &rows, len, lo..hi),
                _ => {
                    let mut to = lo * rows.len() * block_bytes;
                    for o in lo..hi {
                        for &k in &rows {
                            let from = (o * len + k) * block_bytes;
                            std::ptr::copy_nonoverlapping(src.add(from), dst.add(to), block_bytes);
                            to += block_bytes;
                        }
                    }
                }
            }
        }
    };
    split_rows(outer, outer * count * block_bytes, 4, &job);
    Ok(())
}

/// Rows `outer` of a gather of one-element blocks of type `T`: `dst[o][j] = src[o][rows[j]]`.
///
/// # Safety
/// `src` holds the rows of `len` elements, `dst` those of `rows.len()`; every index is below
/// `len`.
unsafe fn take_rows<T: Copy>(
    src: *const u8,
    dst: *mut u8,
    rows: &[usize],
    len: usize,
    outer: std::ops::Range<usize>,
) {
    let (src, dst) = (src as *const T, dst as *mut T);
    for o in outer {
        // SAFETY: the caller's contract; unaligned reads and writes, as the arena's offsets
        // need not be multiples of T's alignment.
        unsafe {
            let (from, to) = (src.add(o * len), dst.add(o * rows.len()));
            for (j, &k) in rows.iter().enumerate() {
                to.add(j).write_unaligned(from.add(k).read_unaligned());
            }
        }
    }
}
