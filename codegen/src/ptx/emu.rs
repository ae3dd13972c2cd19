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
        // Whether each thread has ended.
        let mut done = vec![false; n];
        loop {
            let mut waiting = 0;
            for t in 0..n {
                if done[t] {
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
                let stop = ctx.go(
                    &mut regs[t * nregs..(t + 1) * nregs],
                    &mut pc[t],
                    &mut steps[t],
                    mem,
                    &mut shared,
                )?;
                match stop {
                    Stop::Barrier => waiting += 1,
                    Stop::Ended => done[t] = true,
                }
            }
            if waiting == 0 {
                break;
            }
            if done.iter().any(|&d| d) {
                return Err(format!(
                    "kernel {}: block {block}: a barrier is reached by {waiting} threads after others ended",
                    k.name
                ));
            }
        }
    }
    Ok(())
}

/// Why a thread stopped.
enum Stop {
    Barrier,
    Ended,
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
        mem: &mut Memory,
        shared: &mut [u8],
    ) -> Result<Stop, String> {
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
                Inst::Bar => return Ok(Stop::Barrier),
                Inst::Ret => return Ok(Stop::Ended),
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
