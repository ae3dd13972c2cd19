//! The GPU kernel form run on the CPU: every block of the grid, every thread of a block, with
//! `bar.sync` semantics, over device memory made of separate buffers whose bounds every access
//! is checked against. What it runs is what [`super::print`] writes as PTX, so GPU indexing,
//! tiling and edge handling are tested against the reference interpreter on any machine.
//!
//! Threads of a block run one after another, each until it reaches a barrier or ends; when
//! every thread waits at the barrier they all go on. A barrier some threads reach after others
//! ended is an error (undefined on a GPU), as is any access outside a buffer, a division by
//! zero, or a thread running past a step limit.

use super::prog::{Cmp, CmpTy, Cvt, FOp, FUn, IOp, IUn, Inst, Kernel, Mem, RegTy, Space, Sreg};

/// Where buffer `i`'s addresses start: `(i + 1) << BUFFER_SHIFT`.
const BUFFER_SHIFT: u32 = 40;

/// Instructions one thread may execute before the emulator gives up.
const STEP_LIMIT: u64 = 1 << 32;

/// Device memory: separate buffers, each at its own address range.
#[derive(Default)]
pub struct Memory {
    bufs: Vec<Vec<u8>>,
}

impl Memory {
    /// A new buffer holding `bytes`; its address.
    pub fn alloc(&mut self, bytes: Vec<u8>) -> u64 {
        self.bufs.push(bytes);
        (self.bufs.len() as u64) << BUFFER_SHIFT
    }

    /// The bytes of the buffer at `addr` (as [`Memory::alloc`] returned it).
    pub fn bytes(&self, addr: u64) -> &[u8] {
        &self.bufs[(addr >> BUFFER_SHIFT) as usize - 1]
    }

    /// The `n` bytes at `addr`.
    pub fn read(&mut self, addr: u64, n: u64) -> Result<&[u8], String> {
        self.at(addr, n).map(|b| &*b)
    }

    /// Copies `n` bytes from `src` to `dst` (in different buffers or not overlapping).
    pub fn copy(&mut self, src: u64, dst: u64, n: u64) -> Result<(), String> {
        let bytes = self.read(src, n)?.to_vec();
        self.at(dst, n)?.copy_from_slice(&bytes);
        Ok(())
    }

    fn at(&mut self, addr: u64, n: u64) -> Result<&mut [u8], String> {
        let b = (addr >> BUFFER_SHIFT) as usize;
        let off = addr & ((1 << BUFFER_SHIFT) - 1);
        let buf = (b.checked_sub(1))
            .and_then(|b| self.bufs.get_mut(b))
            .ok_or_else(|| format!("address {addr:#x} is in no buffer"))?;
        let len = buf.len() as u64;
        if off + n > len {
            return Err(format!(
                "access of {n} bytes at offset {off} of a buffer of {len} bytes"
            ));
        }
        Ok(&mut buf[off as usize..(off + n) as usize])
    }
}

/// Runs kernel `k` on `blocks` blocks of `k.block` threads with `params` (addresses in `mem`).
pub fn run(k: &Kernel, blocks: u32, params: &[u64], mem: &mut Memory) -> Result<(), String> {
    if params.len() != k.params as usize {
        return Err(format!(
            "kernel {} takes {} parameters, given {}",
            k.name,
            k.params,
            params.len()
        ));
    }
    let mut target = vec![0usize; k.labels as usize];
    for (i, inst) in k.body.iter().enumerate() {
        if let Inst::Label(l) = inst {
            target[l.0 as usize] = i;
        }
    }
    let n = k.block as usize;
    let nregs = k.regs.len();
    for block in 0..blocks {
        let mut shared = vec![0u8; k.shared as usize];
        let mut regs = vec![0u64; n * nregs];
        let mut pc = vec![0usize; n];
        let mut steps = vec![0u64; n];
        let mut copies: Vec<Copies> = (0..n).map(|_| Copies::default()).collect();
        let mut state = vec![State::Running; n];
        loop {
            for t in 0..n {
                if state[t] != State::Running {
                    continue;
                }
                let ctx = Thread {
                    k,
                    target: &target,
                    params,
                    tid: t as u32,
                    block,
                    blocks,
                };
                state[t] = ctx.go(
                    &mut regs[t * nregs..(t + 1) * nregs],
                    &mut pc[t],
                    &mut steps[t],
                    &mut copies[t],
                    mem,
                    &mut shared,
                )?;
            }
            // Warps whose every thread waits at a shuffle exchange their values.
            let mut shuffled = false;
            for lanes in (0..n).collect::<Vec<_>>().chunks(32) {
                if !lanes.iter().all(|&t| state[t] == State::Shuffle) {
                    continue;
                }
                let at = pc[lanes[0]] - 1;
                let Inst::ShflDown(d, a, delta) = k.body[at] else {
                    unreachable!("a thread stops at a shuffle only")
                };
                if lanes.len() < 32 || lanes.iter().any(|&t| pc[t] - 1 != at) {
                    return Err(format!(
                        "kernel {}: block {block}: threads {}.. of a warp shuffle apart (a partial \
                         warp or different instructions)",
                        k.name, lanes[0]
                    ));
                }
                let vals: Vec<u64> = (lanes.iter())
                    .map(|&t| regs[t * nregs + a.0 as usize])
                    .collect();
                for (lane, &t) in lanes.iter().enumerate() {
                    let from = lane + delta as usize;
                    regs[t * nregs + d.0 as usize] =
                        if from < 32 { vals[from] } else { vals[lane] };
                    state[t] = State::Running;
                }
                shuffled = true;
            }
            if shuffled {
                continue;
            }
            let ended = state.iter().filter(|&&s| s == State::Ended).count();
            let waiting = state.iter().filter(|&&s| s == State::Barrier).count();
            if ended == n {
                break;
            }
            if waiting + ended < n {
                return Err(format!(
                    "kernel {}: block {block}: a shuffle is reached by part of a warp only",
                    k.name
                ));
            }
            if ended > 0 {
                return Err(format!(
                    "kernel {}: block {block}: a barrier is reached by {waiting} threads after others ended",
                    k.name
                ));
            }
            state.fill(State::Running);
        }
    }
    Ok(())
}

/// Where a thread is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// Waiting at a barrier (past it).
    Barrier,
    /// Waiting at a shuffle (past it) for the rest of its warp.
    Shuffle,
    Ended,
}

/// A thread's asynchronous copies not yet landed: the ones since its last commit, and its
/// committed groups, oldest first. A copy lands when a wait retires its group, so a kernel
/// reading shared memory before its wait reads what was there before.
#[derive(Default)]
struct Copies {
    open: Vec<AsyncCopy>,
    groups: std::collections::VecDeque<Vec<AsyncCopy>>,
}

/// One asynchronous copy: `fill` bytes from global `src`, then zeros, to shared `dst`.
struct AsyncCopy {
    dst: u64,
    src: u64,
    bytes: u64,
    fill: u64,
}

/// What one thread sees of its launch.
struct Thread<'a> {
    k: &'a Kernel,
    target: &'a [usize],
    params: &'a [u64],
    tid: u32,
    block: u32,
    blocks: u32,
}

fn f32_of(bits: u64) -> f32 {
    f32::from_bits(bits as u32)
}

fn f64_of(bits: u64) -> f64 {
    f64::from_bits(bits)
}

/// PTX's `min` and `max` (`max` when `max` is true): NaN only if both are; `-0` below `+0`.
fn ptx_minmax<T: PartialOrd + Copy>(
    a: T,
    b: T,
    max: bool,
    nan: impl Fn(T) -> bool,
    neg: impl Fn(T) -> bool,
) -> Option<T> {
    match (nan(a), nan(b)) {
        (true, true) => None,
        (true, false) => Some(b),
        (false, true) => Some(a),
        _ => {
            let pick_a = if a == b {
                // Equal (zeros of either sign among them): min takes the negative one.
                neg(a) != max
            } else {
                (a < b) != max
            };
            Some(if pick_a { a } else { b })
        }
    }
}

impl Thread<'_> {
    /// Runs from `pc` until a barrier (after it) or the end.
    fn go(
        &self,
        regs: &mut [u64],
        pc: &mut usize,
        steps: &mut u64,
        copies: &mut Copies,
        mem: &mut Memory,
        shared: &mut [u8],
    ) -> Result<State, String> {
        let k = self.k;
        let ty = |r: super::prog::Reg| k.regs[r.0 as usize];
        let err = |pc: usize, e: String| {
            format!(
                "kernel {}: thread {} of block {}, instruction {pc} ({:?}): {e}",
                k.name, self.tid, self.block, k.body[pc]
            )
        };
        loop {
            let i = *pc;
            *steps += 1;
            if *steps > STEP_LIMIT {
                return Err(err(i, "step limit reached".into()));
            }
            let Some(inst) = k.body.get(i) else {
                return Err(format!("kernel {}: runs past its end", k.name));
            };
            *pc += 1;
            let get = |r: super::prog::Reg| regs[r.0 as usize];
            let width = |r| if ty(r).bytes() == 8 { 64 } else { 32 };
            let mask = |r| {
                if width(r) == 64 {
                    u64::MAX
                } else {
                    u32::MAX as u64
                }
            };
            // The register the instruction writes, and its bits.
            let write: Option<(super::prog::Reg, u64)> = match *inst {
                Inst::Sreg(d, s) => {
                    let v = match s {
                        Sreg::Tid => self.tid,
                        Sreg::Ntid => k.block,
                        Sreg::Ctaid => self.block,
                        Sreg::Nctaid => self.blocks,
                    };
                    Some((d, v as u64))
                }
                Inst::Param(d, j) => Some((d, self.params[j as usize])),
                Inst::SharedBase(d) => Some((d, 0)),
                Inst::Imm(d, bits) => Some((d, bits)),
                Inst::Mov(d, a) => Some((d, get(a))),
                Inst::Cvt(c, d, a) => {
                    let x = get(a);
                    let v = match c {
                        Cvt::U32ToU64 => x & u32::MAX as u64,
                        Cvt::S32ToFloat => {
                            let n = x as u32 as i32;
                            if ty(d) == RegTy::F64 {
                                (n as f64).to_bits()
                            } else {
                                (n as f32).to_bits() as u64
                            }
                        }
                        Cvt::FloatToS32 => {
                            // Rust's `as` truncates, saturates and takes NaN to 0, as PTX does.
                            let n = if ty(a) == RegTy::F64 {
                                f64_of(x) as i32
                            } else {
                                f32_of(x) as i32
                            };
                            n as u32 as u64
                        }
                        Cvt::FloatToFloat => {
                            if ty(d) == RegTy::F64 {
                                (f32_of(x) as f64).to_bits()
                            } else {
                                (f64_of(x) as f32).to_bits() as u64
                            }
                        }
                        Cvt::S8 => x as u8 as i8 as i32 as u32 as u64,
                        Cvt::U8 => x & 0xff,
                        Cvt::ToGlobal => x,
                    };
                    Some((d, v))
                }
                Inst::IUn(op, d, a) => {
                    let x = get(a);
                    let v = if width(d) == 64 {
                        let n = x as i64;
                        (match op {
                            IUn::Neg => n.wrapping_neg(),
                            IUn::Abs => n.wrapping_abs(),
                        }) as u64
                    } else {
                        let n = x as u32 as i32;
                        (match op {
                            IUn::Neg => n.wrapping_neg(),
                            IUn::Abs => n.wrapping_abs(),
                        }) as u32 as u64
                    };
                    Some((d, v))
                }
                Inst::IBin(op, d, a, b) => {
                    let w = width(d);
                    let (x, y) = (get(a), get(b));
                    // Signed views at the register's width.
                    let sx = if w == 64 {
                        x as i64
                    } else {
                        x as u32 as i32 as i64
                    };
                    let sy = if w == 64 {
                        y as i64
                    } else {
                        y as u32 as i32 as i64
                    };
                    let v = match op {
                        IOp::Add => x.wrapping_add(y),
                        IOp::Sub => x.wrapping_sub(y),
                        IOp::Mul => x.wrapping_mul(y),
                        IOp::DivU | IOp::RemU => {
                            let y = y & mask(d);
                            if y == 0 {
                                return Err(err(i, "division by zero".into()));
                            }
                            let x = x & mask(d);
                            if op == IOp::DivU { x / y } else { x % y }
                        }
                        IOp::MinS => sx.min(sy) as u64,
                        IOp::MaxS => sx.max(sy) as u64,
                        IOp::And => x & y,
                        IOp::Or => x | y,
                        // Shifts by the width or more: 0, or the sign for an arithmetic right
                        // shift, as PTX clamps them.
                        IOp::Shl => {
                            if y >= w {
                                0
                            } else {
                                x << y
                            }
                        }
                        IOp::ShrU => {
                            if y >= w {
                                0
                            } else {
                                (x & mask(d)) >> y
                            }
                        }
                        IOp::ShrS => (sx >> y.min(w - 1)) as u64,
                    };
                    Some((d, v))
                }
                Inst::IMad(d, a, b, c) => {
                    Some((d, get(a).wrapping_mul(get(b)).wrapping_add(get(c))))
                }
                Inst::FUn(op, d, a) => {
                    // The same operation at either width.
                    macro_rules! un {
                        ($x:expr) => {{
                            let x = $x;
                            match op {
                                FUn::Neg => -x,
                                FUn::Abs => x.abs(),
                                FUn::Sqrt => x.sqrt(),
                                FUn::Rni => x.round_ties_even(),
                                FUn::Rmi => x.floor(),
                                FUn::Rpi => x.ceil(),
                            }
                        }};
                    }
                    let v = if ty(d) == RegTy::F64 {
                        un!(f64_of(get(a))).to_bits()
                    } else {
                        un!(f32_of(get(a))).to_bits() as u64
                    };
                    Some((d, v))
                }
                Inst::FBin(op, d, a, b) => {
                    // The same operation at either width; a min or max of two NaNs is `nan`.
                    macro_rules! bin {
                        ($x:expr, $y:expr, $nan:expr) => {{
                            let (x, y) = ($x, $y);
                            let mm = |max| {
                                ptx_minmax(x, y, max, |v| v.is_nan(), |v| v.is_sign_negative())
                                    .unwrap_or($nan)
                            };
                            match op {
                                FOp::Add => x + y,
                                FOp::Sub => x - y,
                                FOp::Mul => x * y,
                                FOp::Div => x / y,
                                FOp::Min => mm(false),
                                FOp::Max => mm(true),
                            }
                        }};
                    }
                    let v = if ty(d) == RegTy::F64 {
                        bin!(f64_of(get(a)), f64_of(get(b)), f64::NAN).to_bits()
                    } else {
                        // Both NaN: the canonical NaN.
                        bin!(f32_of(get(a)), f32_of(get(b)), f32::from_bits(0x7fff_ffff)).to_bits()
                            as u64
                    };
                    Some((d, v))
                }
                Inst::Fma(d, a, b, c) => {
                    let v = if ty(d) == RegTy::F64 {
                        f64_of(get(a))
                            .mul_add(f64_of(get(b)), f64_of(get(c)))
                            .to_bits()
                    } else {
                        f32_of(get(a))
                            .mul_add(f32_of(get(b)), f32_of(get(c)))
                            .to_bits() as u64
                    };
                    Some((d, v))
                }
                Inst::Setp(ct, cmp, d, a, b) => {
                    let (x, y) = (get(a), get(b));
                    let v = match ct {
                        CmpTy::Float => {
                            let (x, y) = if ty(a) == RegTy::F64 {
                                (f64_of(x), f64_of(y))
                            } else {
                                (f32_of(x) as f64, f32_of(y) as f64)
                            };
                            match cmp {
                                Cmp::Eq => x == y,
                                Cmp::Ne => x != y && !x.is_nan() && !y.is_nan(),
                                Cmp::Lt => x < y,
                                Cmp::Le => x <= y,
                                Cmp::Gt => x > y,
                                Cmp::Ge => x >= y,
                                Cmp::Neu => x != y,
                                Cmp::Nan => x.is_nan() || y.is_nan(),
                            }
                        }
                        CmpTy::Signed | CmpTy::Unsigned => {
                            let w = width(a);
                            let (x, y) = if ct == CmpTy::Signed {
                                if w == 64 {
                                    (x as i64 as i128, y as i64 as i128)
                                } else {
                                    (x as u32 as i32 as i128, y as u32 as i32 as i128)
                                }
                            } else {
                                ((x & mask(a)) as i128, (y & mask(a)) as i128)
                            };
                            match cmp {
                                Cmp::Eq => x == y,
                                Cmp::Ne | Cmp::Neu => x != y,
                                Cmp::Lt => x < y,
                                Cmp::Le => x <= y,
                                Cmp::Gt => x > y,
                                Cmp::Ge => x >= y,
                                Cmp::Nan => false,
                            }
                        }
                    };
                    Some((d, v as u64))
                }
                Inst::Selp(d, a, b, p) => {
                    let v = if get(p) != 0 { get(a) } else { get(b) };
                    Some((d, v))
                }
                Inst::Ld(space, m, d, a) => {
                    let n = m.bytes();
                    let bytes: &[u8] = match space {
                        Space::Global => mem.at(get(a), n).map_err(|e| err(i, e))?,
                        Space::Shared => shared_at(shared, get(a), n).map_err(|e| err(i, e))?,
                    };
                    let mut raw = [0u8; 8];
                    raw[..n as usize].copy_from_slice(bytes);
                    let v = u64::from_le_bytes(raw);
                    let v = match m {
                        Mem::S8 => v as u8 as i8 as i32 as u32 as u64,
                        _ => v,
                    };
                    Some((d, v))
                }
                Inst::St(space, m, a, v) => {
                    let n = m.bytes();
                    let raw = get(v).to_le_bytes();
                    let bytes: &mut [u8] = match space {
                        Space::Global => mem.at(get(a), n).map_err(|e| err(i, e))?,
                        Space::Shared => shared_at(shared, get(a), n).map_err(|e| err(i, e))?,
                    };
                    bytes.copy_from_slice(&raw[..n as usize]);
                    None
                }
                Inst::Label(_) => None,
                Inst::Bra(l, p) => {
                    if p.is_none_or(|(p, when)| (get(p) != 0) == when) {
                        *pc = self.target[l.0 as usize];
                    }
                    None
                }
                Inst::Ld4(space, d, a) => {
                    let addr = get(a);
                    if addr % 16 != 0 {
                        return Err(err(i, format!("a 16-byte load at {addr:#x}")));
                    }
                    let bytes: &[u8] = match space {
                        Space::Global => mem.at(addr, 16).map_err(|e| err(i, e))?,
                        Space::Shared => shared_at(shared, addr, 16).map_err(|e| err(i, e))?,
                    };
                    let words: Vec<u64> = (bytes.chunks(4))
                        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as u64)
                        .collect();
                    for (r, w) in d.iter().zip(words) {
                        regs[r.0 as usize] = w;
                    }
                    None
                }
                Inst::St4(space, a, v) => {
                    let addr = get(a);
                    if addr % 16 != 0 {
                        return Err(err(i, format!("a 16-byte store at {addr:#x}")));
                    }
                    let raw: Vec<u8> = v
                        .iter()
                        .flat_map(|&r| (get(r) as u32).to_le_bytes())
                        .collect();
                    let bytes: &mut [u8] = match space {
                        Space::Global => mem.at(addr, 16).map_err(|e| err(i, e))?,
                        Space::Shared => shared_at(shared, addr, 16).map_err(|e| err(i, e))?,
                    };
                    bytes.copy_from_slice(&raw);
                    None
                }
                Inst::ShflDown(..) => return Ok(State::Shuffle),
                Inst::CpAsync {
                    dst,
                    src,
                    bytes,
                    fill,
                } => {
                    let (d, s, n, fill) = (get(dst), get(src), bytes as u64, get(fill));
                    if d % n != 0 || s % n != 0 || (fill != 0 && fill != n) {
                        return Err(err(
                            i,
                            format!("a copy of {n} bytes from {s:#x} to {d:#x}, {fill} read"),
                        ));
                    }
                    shared_at(shared, d, n).map_err(|e| err(i, e))?;
                    copies.open.push(AsyncCopy {
                        dst: d,
                        src: s,
                        bytes: n,
                        fill,
                    });
                    None
                }
                Inst::CpAsyncCommit => {
                    let group = std::mem::take(&mut copies.open);
                    copies.groups.push_back(group);
                    None
                }
                Inst::CpAsyncWait(keep) => {
                    while copies.groups.len() > keep as usize {
                        for cp in copies.groups.pop_front().expect("a group") {
                            let mut raw = vec![0u8; cp.bytes as usize];
                            let from = mem.read(cp.src, cp.fill).map_err(|e| err(i, e))?;
                            raw[..cp.fill as usize].copy_from_slice(from);
                            shared_at(shared, cp.dst, cp.bytes)
                                .map_err(|e| err(i, e))?
                                .copy_from_slice(&raw);
                        }
                    }
                    None
                }
                Inst::Bar => return Ok(State::Barrier),
                Inst::Ret => return Ok(State::Ended),
            };
            if let Some((d, v)) = write {
                regs[d.0 as usize] = v & mask(d);
            }
        }
    }
}

fn shared_at(shared: &mut [u8], addr: u64, n: u64) -> Result<&mut [u8], String> {
    let len = shared.len() as u64;
    if addr.checked_add(n).is_none_or(|end| end > len) {
        return Err(format!(
            "shared access of {n} bytes at {addr} of {len} bytes"
        ));
    }
    Ok(&mut shared[addr as usize..(addr + n) as usize])
}

#[cfg(test)]
mod tests {
    use super::super::prog::{Builder, Cmp, CmpTy, Cvt, IOp, Inst, Mem, RegTy, Space, Sreg};
    use super::*;

    /// A block reverses 64 floats through shared memory: each thread stores its element,
    /// waits at the barrier, and reads its mirror's. Without the barrier a thread would read
    /// shared memory its mirror has not written yet (here: zeros).
    fn reverse(barrier: bool) -> Kernel {
        let mut b = Builder::new("reverse".into(), 2, 64);
        b.k.shared = 256;
        let tid = b.reg(RegTy::I32);
        b.push(Inst::Sreg(tid, Sreg::Tid));
        let src = b.reg(RegTy::I64);
        b.push(Inst::Param(src, 0));
        let dst = b.reg(RegTy::I64);
        b.push(Inst::Param(dst, 1));
        let smem = b.reg(RegTy::I64);
        b.push(Inst::SharedBase(smem));
        let t64 = b.cvt(Cvt::U32ToU64, RegTy::I64, tid);
        let two = b.imm(RegTy::I32, 2);
        let off = b.ibin(IOp::Shl, t64, two);
        let a = b.ibin(IOp::Add, src, off);
        let x = b.ld(Space::Global, Mem::B32, RegTy::F32, a);
        let s = b.ibin(IOp::Add, smem, off);
        b.push(Inst::St(Space::Shared, Mem::B32, s, x));
        if barrier {
            b.push(Inst::Bar);
        }
        let last = b.imm(RegTy::I32, 63);
        let m = b.ibin(IOp::Sub, last, tid);
        let m64 = b.cvt(Cvt::U32ToU64, RegTy::I64, m);
        let moff = b.ibin(IOp::Shl, m64, two);
        let ms = b.ibin(IOp::Add, smem, moff);
        let y = b.ld(Space::Shared, Mem::B32, RegTy::F32, ms);
        let o = b.ibin(IOp::Add, dst, off);
        b.push(Inst::St(Space::Global, Mem::B32, o, y));
        b.push(Inst::Ret);
        b.finish()
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        (bytes.chunks(4))
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn barriers_order_a_block() {
        for barrier in [true, false] {
            let k = reverse(barrier);
            let mut mem = Memory::default();
            let x: Vec<u8> = (0..64)
                .flat_map(|i| (i as f32 + 1.0).to_le_bytes())
                .collect();
            let src = mem.alloc(x);
            let dst = mem.alloc(vec![0; 256]);
            run(&k, 1, &[src, dst], &mut mem).unwrap();
            let got = floats(mem.bytes(dst));
            if barrier {
                let want: Vec<f32> = (0..64).map(|i| 64.0 - i as f32).collect();
                assert_eq!(got, want);
            } else {
                // Threads run in order, so the first half reads mirrors not yet written.
                assert_eq!(got[0], 0.0);
                assert_eq!(got[63], 1.0);
            }
        }
    }

    #[test]
    fn bad_accesses_and_barriers_are_errors() {
        let k = reverse(true);
        let mut mem = Memory::default();
        let src = mem.alloc(vec![0; 255]);
        let dst = mem.alloc(vec![0; 256]);
        let e = run(&k, 1, &[src, dst], &mut mem).unwrap_err();
        assert!(e.contains("access of 4 bytes at offset 252"), "{e}");
        // A barrier after some threads ended: odd threads return first.
        let mut b = Builder::new("split".into(), 0, 4);
        let tid = b.reg(RegTy::I32);
        b.push(Inst::Sreg(tid, Sreg::Tid));
        let one = b.imm(RegTy::I32, 1);
        let odd = b.ibin(IOp::And, tid, one);
        let zero = b.imm(RegTy::I32, 0);
        let p = b.setp(CmpTy::Unsigned, Cmp::Ne, odd, zero);
        let end = b.label();
        b.push(Inst::Bra(end, Some((p, true))));
        b.push(Inst::Bar);
        b.place(end);
        b.push(Inst::Ret);
        let e = run(&b.finish(), 2, &[], &mut mem).unwrap_err();
        assert!(e.contains("after others ended"), "{e}");
    }

    /// A block of `threads` where each thread's register holds its index + 1, shuffled down
    /// by `delta` and stored at its index.
    fn shuffle(threads: u32, delta: u32) -> Kernel {
        let mut b = Builder::new("shuffle".into(), 1, threads);
        let tid = b.reg(RegTy::I32);
        b.push(Inst::Sreg(tid, Sreg::Tid));
        let one = b.imm(RegTy::I32, 1);
        let x = b.ibin(IOp::Add, tid, one);
        let y = b.reg(RegTy::I32);
        b.push(Inst::ShflDown(y, x, delta));
        let dst = b.reg(RegTy::I64);
        b.push(Inst::Param(dst, 0));
        let t64 = b.cvt(Cvt::U32ToU64, RegTy::I64, tid);
        let two = b.imm(RegTy::I32, 2);
        let off = b.ibin(IOp::Shl, t64, two);
        let a = b.ibin(IOp::Add, dst, off);
        b.push(Inst::St(Space::Global, Mem::B32, a, y));
        b.push(Inst::Ret);
        b.finish()
    }

    fn words(bytes: &[u8]) -> Vec<u32> {
        (bytes.chunks(4))
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn shuffles_exchange_within_each_warp() {
        let mut mem = Memory::default();
        let dst = mem.alloc(vec![0; 64 * 4]);
        run(&shuffle(64, 5), 1, &[dst], &mut mem).unwrap();
        let got = words(mem.bytes(dst));
        for (t, &v) in got.iter().enumerate() {
            // Lanes 27..31 of each warp keep their own value: no lane 32 and up.
            let lane = t % 32;
            let want = if lane + 5 < 32 { t + 5 + 1 } else { t + 1 };
            assert_eq!(v as usize, want, "thread {t}");
        }
        // A block that is not whole warps cannot shuffle with a full mask.
        let e = run(&shuffle(48, 1), 1, &[dst], &mut mem).unwrap_err();
        assert!(e.contains("partial"), "{e}");
    }

    /// Thread 0 copies 16 bytes from `src` into shared memory asynchronously, reads them back
    /// (after waiting if `wait`) and stores them to `dst`; `fill` bytes are read, the rest zero.
    fn copy(wait: bool, fill: u64) -> Kernel {
        let mut b = Builder::new("copy".into(), 2, 32);
        b.k.shared = 16;
        let src = b.reg(RegTy::I64);
        b.push(Inst::Param(src, 0));
        let dst = b.reg(RegTy::I64);
        b.push(Inst::Param(dst, 1));
        let smem = b.reg(RegTy::I64);
        b.push(Inst::SharedBase(smem));
        let tid = b.reg(RegTy::I32);
        b.push(Inst::Sreg(tid, Sreg::Tid));
        let zero = b.imm(RegTy::I32, 0);
        let others = b.setp(CmpTy::Unsigned, Cmp::Ne, tid, zero);
        let end = b.label();
        b.push(Inst::Bra(end, Some((others, true))));
        let fill = b.imm(RegTy::I32, fill);
        b.push(Inst::CpAsync {
            dst: smem,
            src,
            bytes: 16,
            fill,
        });
        b.push(Inst::CpAsyncCommit);
        if wait {
            b.push(Inst::CpAsyncWait(0));
        }
        let v = [(); 4].map(|_| b.reg(RegTy::I32));
        b.push(Inst::Ld4(Space::Shared, v, smem));
        b.push(Inst::St4(Space::Global, dst, v));
        b.place(end);
        b.push(Inst::Ret);
        b.finish()
    }

    #[test]
    fn async_copies_land_at_their_wait() {
        let src: Vec<u8> = (1..=16).collect();
        for (wait, fill) in [(true, 16), (true, 0), (false, 16)] {
            let mut mem = Memory::default();
            let s = mem.alloc(src.clone());
            let d = mem.alloc(vec![0xff; 16]);
            run(&copy(wait, fill), 1, &[s, d], &mut mem).unwrap();
            // Before its wait the copy has not landed: shared memory still holds zeros.
            let want = if wait && fill == 16 {
                src.clone()
            } else {
                vec![0; 16]
            };
            assert_eq!(mem.bytes(d), &want[..], "wait {wait}, fill {fill}");
        }
        // A misaligned 16-byte access is an error, as on the device.
        let mut mem = Memory::default();
        let s = mem.alloc(src.clone());
        let d = mem.alloc(vec![0; 32]);
        let e = run(&copy(true, 16), 1, &[s, d + 4], &mut mem).unwrap_err();
        assert!(e.contains("16-byte store"), "{e}");
    }

    #[test]
    fn float_semantics_follow_ptx() {
        let nan = f32::NAN;
        assert_eq!(
            ptx_minmax(nan, 1.0f32, false, f32::is_nan, |v| v.is_sign_negative()),
            Some(1.0)
        );
        let z = ptx_minmax(0.0f32, -0.0, false, f32::is_nan, |v| v.is_sign_negative()).unwrap();
        assert!(z == 0.0 && z.is_sign_negative());
        let z = ptx_minmax(-0.0f32, 0.0, true, f32::is_nan, |v| v.is_sign_negative()).unwrap();
        assert!(z == 0.0 && z.is_sign_positive());
        assert_eq!(
            ptx_minmax(nan, nan, true, f32::is_nan, |v| v.is_sign_negative()),
            None
        );
    }
}
