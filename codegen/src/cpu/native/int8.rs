//! The u8 x i8 -> i32 matrix product on AVX-512 VNNI (`vpdpbusd`), for `matmul_integer`.
//!
//! `vpdpbusd` multiplies 4 unsigned bytes by 4 signed bytes and adds the 4 products to an i32
//! lane, wrapping: exact, so the raw product `A' B'` is the interpreter's sum modulo 2^32. The
//! caller maps any u8/i8 combination onto u8 x i8 (an i8 operand plus 128 is a u8 one, a u8
//! one minus 128 an i8 one, the zero points shifted alike) and the zero points come back as
//! corrections: `sum (a - za)(b - zb) = A'B' - za colsum(B) - zb rowsum(A) + k za zb`, all
//! wrapping in i32, which is the same sum modulo 2^32.
//!
//! B is packed once per batch (once at compile time when it is a constant: [`PackedB`]) into
//! panels of 16 columns, 4 rows of `k` at a time (64 bytes: 4 bytes per column), `k` padded to
//! a multiple of 4 with zeros; each row of A (padded the same
//! way) is read 4 bytes at a time, broadcast. The kernel takes 4 rows by 2 panels: 8
//! accumulators, per 4-deep step 2 panel loads, 4 broadcasts and 8 `vpdpbusd`. Blocks of 4
//! rows are split across the thread pool for products of 2^20 multiply-adds or more.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Columns per panel (the i32 lanes of a 512-bit register).
const PANEL: usize = 16;
/// Rows of A per kernel call.
const ROWS: usize = 4;

/// B (`k x n`, i8) packed for [`product_packed`]: panel `p`, step `g`, column `c`, byte `t` at
/// `((p * kp/4 + g) * 16 + c) * 4 + t`, `k` padded to `kp` (a multiple of 4) with zeros; and its
/// column sums. Made per call, or once at compile time when B is a constant; whole panels by
/// two rounds of byte and word unpacks of four 16-byte rows (packing a byte at a time made a 64
/// x 1024 x 1024 product with B not constant 1.40 ms instead of 0.61).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PackedB {
    packed: Vec<i8>,
    colsum: Vec<i32>,
}

impl PackedB {
    /// `b`'s bytes with `flip` xored in (0x80: a u8 B read as i8 minus 128), packed.
    pub(super) fn new(b: &[u8], flip: u8, (k, n): (usize, usize)) -> PackedB {
        let kp = k.div_ceil(4) * 4;
        let panels = n.div_ceil(PANEL);
        let mut packed = vec![0i8; panels * kp * PANEL];
        let mut colsum = vec![0i32; n];
        for row in b.chunks_exact(n.max(1)).take(k) {
            for (s, &x) in colsum.iter_mut().zip(row) {
                *s = s.wrapping_add((x ^ flip) as i8 as i32);
            }
        }
        for g in 0..kp / 4 {
            for panel in 0..panels {
                let j0 = panel * PANEL;
                let at = (panel * (kp / 4) + g) * PANEL * 4;
                if j0 + PANEL <= n {
                    // SAFETY: SSE2 (every x86-64 has it); rows `4g..4g + 4` below `k` hold
                    // columns `j0..j0 + 16`, and the step's 64 bytes lie in `packed`.
                    unsafe {
                        let bits = _mm_set1_epi8(flip as i8);
                        let row = |t: usize| {
                            let p = 4 * g + t;
                            if p >= k {
                                return _mm_setzero_si128();
                            }
                            let v = _mm_loadu_si128(b.as_ptr().add(p * n + j0) as *const __m128i);
                            _mm_xor_si128(v, bits)
                        };
                        let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
                        let (t0, t1) = (_mm_unpacklo_epi8(r0, r1), _mm_unpackhi_epi8(r0, r1));
                        let (t2, t3) = (_mm_unpacklo_epi8(r2, r3), _mm_unpackhi_epi8(r2, r3));
                        // Columns 0-3, 4-7, 8-11, 12-15, four rows each.
                        let dst = packed.as_mut_ptr().add(at) as *mut __m128i;
                        _mm_storeu_si128(dst, _mm_unpacklo_epi16(t0, t2));
                        _mm_storeu_si128(dst.add(1), _mm_unpackhi_epi16(t0, t2));
                        _mm_storeu_si128(dst.add(2), _mm_unpacklo_epi16(t1, t3));
                        _mm_storeu_si128(dst.add(3), _mm_unpackhi_epi16(t1, t3));
                    }
                    continue;
                }
                for p in 4 * g..(4 * g + 4).min(k) {
                    for j in j0..n {
                        packed[at + (j - j0) * 4 + p % 4] = (b[p * n + j] ^ flip) as i8;
                    }
                }
            }
        }
        PackedB { packed, colsum }
    }
}

/// `out (m x n) = A (m x k, u8) B (k x n, i8)` less the zero points `za` (one, or one per row)
/// and `zb` (one, or one per column), wrapping in i32; A's and B's bytes are those of `a` and
/// `b` with `flips[0]` and `flips[1]` xored in (0x80: an i8 read as u8 plus 128, or a u8 as i8
/// minus 128).
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 VNNI where `wide`, else AVX2 and AVX-VNNI; the slices
/// hold `m * k`, `k * n` and `m * n` elements.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product(
    a: &[u8],
    b: &[u8],
    flips: [u8; 2],
    (m, k, n): (usize, usize, usize),
    za: &[i32],
    zb: &[i32],
    out: &mut [i32],
    wide: bool,
) {
    let b = PackedB::new(b, flips[1], (k, n));
    // SAFETY: as this function's contract.
    unsafe { product_packed(a, flips[0], &b, (m, k, n), za, zb, out, wide) }
}

/// [`product`] with B packed already (for a `k x n` B).
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 VNNI where `wide`, else AVX2 and AVX-VNNI; `a` holds `m *
/// k` elements and `out` `m * n`; `b` was packed for these `k` and `n`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product_packed(
    a: &[u8],
    flip: u8,
    b: &PackedB,
    (m, k, n): (usize, usize, usize),
    za: &[i32],
    zb: &[i32],
    out: &mut [i32],
    wide: bool,
) {
    let kp = k.div_ceil(4) * 4;
    assert_eq!(b.colsum.len(), n, "B packed for another shape");
    // A's rows padded to `kp`, and their sums.
    let mut rows = vec![0u8; m * kp];
    let mut rowsum = vec![0i32; m];
    for i in 0..m {
        let row = &mut rows[i * kp..i * kp + k];
        for (d, &x) in row.iter_mut().zip(&a[i * k..(i + 1) * k]) {
            *d = x ^ flip;
        }
        // Wrapping, like every other sum here (it cannot overflow below k = 2^23).
        rowsum[i] = row.iter().fold(0i32, |s, &x| s.wrapping_add(x as i32));
    }
    let blocks = m.div_ceil(ROWS);
    // Where the row blocks are fewer than the threads (a batch-1 classifier), each is split
    // into ranges of panel pairs too, so that every thread streams its part of B.
    let pairs = n.div_ceil(2 * PANEL);
    let threads = crate::cpu::pool::threads();
    let parts = if blocks < threads {
        threads.min(pairs)
    } else {
        1
    };
    // SAFETY: each job writes its own block of rows and columns of `out` only.
    let dst = unsafe { crate::cpu::send_ptr::SendPtr::new(out.as_mut_ptr()) };
    let job = |i: usize| {
        let (ib, part) = (i / parts, i % parts);
        let panels = (2 * (part * pairs / parts))..(2 * ((part + 1) * pairs / parts));
        let panels = panels.start..panels.end.min(n.div_ceil(PANEL));
        let sh = Shared {
            rows: &rows,
            packed: &b.packed,
            colsum: &b.colsum,
            rowsum: &rowsum,
            za,
            zb,
        };
        // SAFETY: the features as this function's contract; block `ib`'s rows of `out` are
        // this job's alone.
        unsafe {
            if wide {
                block(sh, (m, k, n), (ib * ROWS, panels), dst.get())
            } else {
                block_avx_vnni(sh, (m, k, n), (ib * ROWS, panels), dst.get())
            }
        }
    };
    row_blocks(blocks * parts, m * n * k, &job);
}

/// `job(b)` for each of `blocks` row blocks: across the thread pool when the product has
/// `work` multiply-adds, 2^20 or more (enough to pay for it), else here.
fn row_blocks(blocks: usize, work: usize, job: &(dyn Fn(usize) + Sync)) {
    if work >= 1 << 20 {
        crate::cpu::pool::for_each(blocks, job);
    } else {
        (0..blocks).for_each(job);
    }
}

/// What every row block reads: A's padded rows, B's panels, their sums and the zero points.
struct Shared<'a> {
    rows: &'a [u8],
    packed: &'a [i8],
    colsum: &'a [i32],
    rowsum: &'a [i32],
    za: &'a [i32],
    zb: &'a [i32],
}

/// Rows `i0..i0 + 4` (those below `m`) and the columns of panels `range` (pairs of them from
/// an even one) of the product, written to `out` (`m x n`, row-major).
///
/// # Safety
/// AVX-512F and VNNI; `out` holds `m * n` elements, and no one else writes these rows and
/// columns.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn block(
    sh: Shared,
    (m, k, n): (usize, usize, usize),
    (i0, range): (usize, std::ops::Range<usize>),
    out: *mut i32,
) {
    let kp = k.div_ceil(4) * 4;
    let panels = range.end;
    let live = (m - i0).min(ROWS);
    for p0 in range.step_by(2) {
        let two = p0 + 1 < panels;
        // SAFETY: rows `i0..i0 + live` (the others read row `i0 + live - 1` again) and panels
        // `p0`, `p0 + 1` (when `two`) lie inside the buffers; loads and stores are unaligned.
        let acc = unsafe {
            let mut acc = [[_mm512_setzero_si512(); 2]; ROWS];
            let row_ptr: [*const u8; ROWS] =
                std::array::from_fn(|r| sh.rows.as_ptr().add((i0 + r.min(live - 1)) * kp));
            let panel0 = sh.packed.as_ptr().add(p0 * kp * PANEL);
            let panel1 = if two {
                sh.packed.as_ptr().add((p0 + 1) * kp * PANEL)
            } else {
                panel0
            };
            for g in 0..kp / 4 {
                let b0 = _mm512_loadu_si512(panel0.add(g * 64) as *const _);
                let b1 = _mm512_loadu_si512(panel1.add(g * 64) as *const _);
                for (r, ptr) in row_ptr.iter().enumerate() {
                    let four = (ptr.add(g * 4) as *const i32).read_unaligned();
                    let x = _mm512_set1_epi32(four);
                    acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, b0);
                    acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, b1);
                }
            }
            let mut lanes = [[[0i32; PANEL]; ROWS]; 2];
            for r in 0..ROWS {
                for h in 0..2 {
                    _mm512_storeu_si512(lanes[h][r].as_mut_ptr() as *mut _, acc[r][h]);
                }
            }
            lanes
        };
        for (h, lanes) in acc.iter().enumerate().take(if two { 2 } else { 1 }) {
            // SAFETY: as this function's contract.
            unsafe { finish_panel(&sh, (m, k, n), (i0, live), (p0 + h) * PANEL, lanes, out) };
        }
    }
}

/// [`block`] on AVX-VNNI (`vpdpbusd` on 256-bit vectors): a panel of 16 columns at a time, as
/// two registers.
///
/// # Safety
/// AVX2 and AVX-VNNI; as [`block`].
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn block_avx_vnni(
    sh: Shared,
    (m, k, n): (usize, usize, usize),
    (i0, panels): (usize, std::ops::Range<usize>),
    out: *mut i32,
) {
    let kp = k.div_ceil(4) * 4;
    let live = (m - i0).min(ROWS);
    for p in panels {
        // SAFETY: rows `i0..i0 + live` (the others read row `i0 + live - 1` again) and panel
        // `p` lie inside the buffers; loads and stores are unaligned.
        let lanes = unsafe {
            let mut acc = [[_mm256_setzero_si256(); 2]; ROWS];
            let row_ptr: [*const u8; ROWS] =
                std::array::from_fn(|r| sh.rows.as_ptr().add((i0 + r.min(live - 1)) * kp));
            let panel = sh.packed.as_ptr().add(p * kp * PANEL);
            for g in 0..kp / 4 {
                let b0 = _mm256_loadu_si256(panel.add(g * 64) as *const _);
                let b1 = _mm256_loadu_si256(panel.add(g * 64 + 32) as *const _);
                for (r, ptr) in row_ptr.iter().enumerate() {
                    let x = _mm256_set1_epi32((ptr.add(g * 4) as *const i32).read_unaligned());
                    acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], x, b0);
                    acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], x, b1);
                }
            }
            let mut lanes = [[0i32; PANEL]; ROWS];
            for (l, acc) in lanes.iter_mut().zip(&acc) {
                _mm256_storeu_si256(l.as_mut_ptr() as *mut _, acc[0]);
                _mm256_storeu_si256(l.as_mut_ptr().add(8) as *mut _, acc[1]);
            }
            lanes
        };
        // SAFETY: as this function's contract.
        unsafe { finish_panel(&sh, (m, k, n), (i0, live), p * PANEL, &lanes, out) };
    }
}

/// The raw sums `lanes` of rows `i0..i0 + live` and columns `j0..j0 + 16` (those below `n`)
/// less the zero points' terms, `A'B' - za colsum - zb rowsum + k za zb`, into `out`.
///
/// # Safety
/// `out` holds `m * n` elements, and no one else writes these rows.
#[inline(always)]
unsafe fn finish_panel(
    sh: &Shared,
    (_, k, n): (usize, usize, usize),
    (i0, live): (usize, usize),
    j0: usize,
    lanes: &[[i32; PANEL]; ROWS],
    out: *mut i32,
) {
    let za_of = |i: usize| sh.za[if sh.za.len() == 1 { 0 } else { i }];
    let zb_of = |j: usize| sh.zb[if sh.zb.len() == 1 { 0 } else { j }];
    let kz = k as i32;
    for (r, lane) in lanes.iter().enumerate().take(live) {
        let i = i0 + r;
        let (zr, sr) = (za_of(i), sh.rowsum[i]);
        for (c, &raw) in lane.iter().enumerate().take(n.saturating_sub(j0)) {
            let j = j0 + c;
            let zc = zb_of(j);
            let v = raw
                .wrapping_sub(zr.wrapping_mul(sh.colsum[j]))
                .wrapping_sub(zc.wrapping_mul(sr))
                .wrapping_add(kz.wrapping_mul(zr).wrapping_mul(zc));
            // SAFETY: row `i` of this block, column `j < n`, as the caller's contract.
            unsafe { *out.add(i * n + j) = v };
        }
    }
}

/// Columns per AVX2 panel (the i32 lanes of a 256-bit register).
const PANEL2: usize = 8;

/// The same product on AVX2 without VNNI, exactly: `vpmaddubsw` would saturate its 16-bit
/// pair sums (255 x -128 twice is -65,280), so both operands less their zero points are
/// widened to i16 (each within -255..255) and multiplied by `vpmaddwd`, whose pair sums (at
/// most 130,050) are exact in i32; no corrections are needed. B less its zero points is packed
/// in 8-column panels of 2-deep i16 pairs, straight from its bytes (8 columns of two rows
/// widened, less their zero points, and interleaved per step); 4 rows by 2 panels accumulate
/// per 2-deep step with 8 `vpmaddwd`. Row blocks split across the pool as for VNNI.
///
/// # Safety
/// The CPU has AVX2; `a` and `b` (bytes, `i8` where `sa`/`sb` say, else `u8`) hold `m * k` and
/// `k * n` elements, `out` `m * n`; the zero points one, or one per row of A / column of B.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn product_avx2(
    (a, sa): (&[u8], bool),
    (b, sb): (&[u8], bool),
    (m, k, n): (usize, usize, usize),
    za: &[i32],
    zb: &[i32],
    out: &mut [i32],
) {
    let kp = k.div_ceil(2) * 2;
    let panels = n.div_ceil(PANEL2);
    let za_of = |i: usize| za[if za.len() == 1 { 0 } else { i }];
    let zb16: Vec<i16> = (0..n)
        .map(|j| zb[if zb.len() == 1 { 0 } else { j }] as i16)
        .collect();
    let level = |x: u8, signed: bool| if signed { x as i8 as i16 } else { x as i16 };
    // Rows of a - za, padded to `kp` with zeros.
    let mut rows = vec![0i16; m * kp];
    for i in 0..m {
        let z = za_of(i) as i16;
        for (d, &x) in rows[i * kp..i * kp + k]
            .iter_mut()
            .zip(&a[i * k..(i + 1) * k])
        {
            *d = level(x, sa) - z;
        }
    }
    if m <= ROWS {
        // SAFETY: AVX2 and the buffers, as this function's contract.
        unsafe { short_avx2(&rows, (b, sb), (m, k, n), &zb16, out) };
        return;
    }
    // Panel p, step g, column c, element t at ((p * kp/2 + g) * 8 + c) * 2 + t: b - zb.
    let mut packed = vec![0i16; panels * kp * PANEL2];
    for g in 0..kp / 2 {
        let (p0, p1) = (2 * g, 2 * g + 1);
        for panel in 0..panels {
            let j0 = panel * PANEL2;
            let at = (panel * (kp / 2) + g) * PANEL2 * 2;
            if j0 + PANEL2 <= n {
                // SAFETY: AVX2 (SSE4.1 with it), as this function's contract; columns
                // `j0..j0 + 8` of rows `p0` and `p1 < k` and step `at..at + 16` are in range.
                unsafe {
                    let z = _mm_loadu_si128(zb16.as_ptr().add(j0) as *const __m128i);
                    let row = |p: usize| {
                        if p >= k {
                            return _mm_setzero_si128();
                        }
                        let bytes = _mm_loadl_epi64(b.as_ptr().add(p * n + j0) as *const __m128i);
                        let wide = if sb {
                            _mm_cvtepi8_epi16(bytes)
                        } else {
                            _mm_cvtepu8_epi16(bytes)
                        };
                        _mm_sub_epi16(wide, z)
                    };
                    let (r0, r1) = (row(p0), row(p1));
                    let dst = packed.as_mut_ptr().add(at);
                    _mm_storeu_si128(dst as *mut __m128i, _mm_unpacklo_epi16(r0, r1));
                    _mm_storeu_si128(dst.add(8) as *mut __m128i, _mm_unpackhi_epi16(r0, r1));
                }
                continue;
            }
            for j in j0..n {
                let c = j - j0;
                packed[at + 2 * c] = level(b[p0 * n + j], sb) - zb16[j];
                if p1 < k {
                    packed[at + 2 * c + 1] = level(b[p1 * n + j], sb) - zb16[j];
                }
            }
        }
    }
    // SAFETY: each job writes the rows of its own block of `out` only.
    let dst = unsafe { crate::cpu::send_ptr::SendPtr::new(out.as_mut_ptr()) };
    let job = |ib: usize| {
        // SAFETY: AVX2, as this function's contract; block `ib`'s rows are this job's alone.
        unsafe { block_avx2(&rows, &packed, (m, k, n), ib * ROWS, dst.get()) }
    };
    row_blocks(m.div_ceil(ROWS), m * n * k, &job);
}

/// [`product_avx2`] for an A of at most 4 rows (a dense layer at batch 1), without packing B,
/// which would read and write all of B to use each element once: each 16-column chunk sums
/// over B's rows two at a time, widened and less their zero points on the way, interleaved
/// into the pairs `vpmaddwd` takes (so the lanes come out as columns 0-3, 8-11 | 4-7, 12-15,
/// put back in order as they are stored). Chunks split across the pool.
///
/// # Safety
/// AVX2; `rows` holds `m` rows of A less its zero points, `k` padded to even with zeros; `b`
/// `k * n` bytes; `zb` `n` zero points; `out` `m * n` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn short_avx2(
    rows: &[i16],
    (b, sb): (&[u8], bool),
    (m, k, n): (usize, usize, usize),
    zb: &[i16],
    out: &mut [i32],
) {
    let kp = k.div_ceil(2) * 2;
    // SAFETY: each chunk writes its own columns of `out` only.
    let dst = unsafe { crate::cpu::send_ptr::SendPtr::new(out.as_mut_ptr()) };
    let chunk = |c: usize| {
        let j0 = c * 16;
        let out = dst.get();
        if j0 + 16 > n {
            // The last columns, one at a time.
            for i in 0..m {
                for j in j0..n {
                    let mut sum = 0i32;
                    for p in 0..k {
                        let v = if sb {
                            b[p * n + j] as i8 as i32
                        } else {
                            b[p * n + j] as i32
                        };
                        let x = rows[i * kp + p] as i32;
                        sum = sum.wrapping_add(x.wrapping_mul(v - zb[j] as i32));
                    }
                    // SAFETY: row `i`, column `j < n` of `out`, this chunk's.
                    unsafe { *out.add(i * n + j) = sum };
                }
            }
            return;
        }
        // SAFETY: AVX2; rows `p < k` of columns `j0..j0 + 16` of B, pairs of `rows`, and
        // columns `j0..j0 + 16` of each row of `out` are in range.
        unsafe {
            let z = _mm256_loadu_si256(zb.as_ptr().add(j0) as *const __m256i);
            let row = |p: usize| {
                if p >= k {
                    return _mm256_setzero_si256();
                }
                let bytes = _mm_loadu_si128(b.as_ptr().add(p * n + j0) as *const __m128i);
                let wide = if sb {
                    _mm256_cvtepi8_epi16(bytes)
                } else {
                    _mm256_cvtepu8_epi16(bytes)
                };
                _mm256_sub_epi16(wide, z)
            };
            let mut acc = [[_mm256_setzero_si256(); 2]; ROWS];
            for p in (0..k).step_by(2) {
                let (r0, r1) = (row(p), row(p + 1));
                let (lo, hi) = (_mm256_unpacklo_epi16(r0, r1), _mm256_unpackhi_epi16(r0, r1));
                for (i, acc) in acc.iter_mut().enumerate().take(m) {
                    let pair = (rows.as_ptr().add(i * kp + p) as *const i32).read_unaligned();
                    let x = _mm256_set1_epi32(pair);
                    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(x, lo));
                    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(x, hi));
                }
            }
            for (i, acc) in acc.iter().enumerate().take(m) {
                let at = out.add(i * n + j0) as *mut __m256i;
                _mm256_storeu_si256(at, _mm256_permute2x128_si256::<0x20>(acc[0], acc[1]));
                _mm256_storeu_si256(at.add(1), _mm256_permute2x128_si256::<0x31>(acc[0], acc[1]));
            }
        }
    };
    row_blocks(n.div_ceil(16), m * n * k, &chunk);
}

/// Rows `i0..i0 + 4` (those below `m`) of the AVX2 product.
///
/// # Safety
/// AVX2; `out` holds `m * n` elements, and no one else writes these rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2(
    rows: &[i16],
    packed: &[i16],
    (m, k, n): (usize, usize, usize),
    i0: usize,
    out: *mut i32,
) {
    let kp = k.div_ceil(2) * 2;
    let panels = n.div_ceil(PANEL2);
    let live = (m - i0).min(ROWS);
    for p0 in (0..panels).step_by(2) {
        let two = p0 + 1 < panels;
        // SAFETY: rows `i0..i0 + live` (the others repeat the last) and panels `p0`, `p0 + 1`
        // (when `two`) lie inside the buffers; loads and stores are unaligned.
        let lanes = unsafe {
            let mut acc = [[_mm256_setzero_si256(); 2]; ROWS];
            let row_ptr: [*const i16; ROWS] =
                std::array::from_fn(|r| rows.as_ptr().add((i0 + r.min(live - 1)) * kp));
            let panel0 = packed.as_ptr().add(p0 * kp * PANEL2);
            let panel1 = if two {
                packed.as_ptr().add((p0 + 1) * kp * PANEL2)
            } else {
                panel0
            };
            for g in 0..kp / 2 {
                let b0 = _mm256_loadu_si256(panel0.add(g * 16) as *const _);
                let b1 = _mm256_loadu_si256(panel1.add(g * 16) as *const _);
                for (r, ptr) in row_ptr.iter().enumerate() {
                    let pair = (ptr.add(g * 2) as *const i32).read_unaligned();
                    let x = _mm256_set1_epi32(pair);
                    acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(x, b0));
                    acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(x, b1));
                }
            }
            let mut lanes = [[[0i32; PANEL2]; 2]; ROWS];
            for r in 0..ROWS {
                for h in 0..2 {
                    _mm256_storeu_si256(lanes[r][h].as_mut_ptr() as *mut _, acc[r][h]);
                }
            }
            lanes
        };
        for (r, lanes) in lanes.iter().enumerate().take(live) {
            let i = i0 + r;
            for (h, lane) in lanes.iter().enumerate().take(if two { 2 } else { 1 }) {
                let j0 = (p0 + h) * PANEL2;
                for (c, &v) in lane.iter().enumerate().take(n.saturating_sub(j0)) {
                    // SAFETY: row `i` of this block, column `j0 + c < n`.
                    unsafe { *out.add(i * n + j0 + c) = v };
                }
            }
        }
    }
}
