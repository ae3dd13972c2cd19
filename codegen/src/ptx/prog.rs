//! The GPU kernel form: what one thread of a kernel executes, as a list of typed
//! instructions over virtual registers. [`super::emu`] runs it on the CPU (every block, every
//! thread, with barriers) and [`super::print`] writes it as PTX, one PTX instruction (or a
//! fixed pair) per instruction here. Anything a GPU kernel does is decided when this form is
//! built (the backend's lowering); the emulator and the printer only carry it out.

/// What a register holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegTy {
    /// A predicate.
    Pred,
    /// 32 bits: a signed or unsigned integer (the instruction says which).
    I32,
    /// 64 bits: an integer or an address.
    I64,
    /// A 32-bit float.
    F32,
    /// A 64-bit float.
    F64,
}

impl RegTy {
    /// Bytes of the register, 0 for a predicate.
    pub fn bytes(self) -> u32 {
        match self {
            RegTy::Pred => 0,
            RegTy::I32 | RegTy::F32 => 4,
            RegTy::I64 | RegTy::F64 => 8,
        }
    }

    /// Whether it is a float.
    pub fn is_float(self) -> bool {
        matches!(self, RegTy::F32 | RegTy::F64)
    }
}

/// A virtual register (an index into [`Kernel::regs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reg(pub u32);

/// A label (an index; [`Inst::Label`] places it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Label(pub u32);

/// The special registers a kernel reads (their `.x` parts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sreg {
    /// The thread's index in its block.
    Tid,
    /// Threads per block.
    Ntid,
    /// The block's index in the grid.
    Ctaid,
    /// Blocks in the grid.
    Nctaid,
}

/// A state space of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Device memory, shared by every thread of the grid.
    Global,
    /// The block's shared memory.
    Shared,
}

/// An element type in memory, as loaded into or stored from a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mem {
    /// 4 bytes, bit for bit (into or from any 32-bit register).
    B32,
    /// 8 bytes, bit for bit.
    B64,
    /// A signed byte, sign-extended into a 32-bit register.
    S8,
    /// An unsigned byte, zero-extended into a 32-bit register; stores write the low byte.
    U8,
}

impl Mem {
    /// Bytes in memory.
    pub fn bytes(self) -> u64 {
        match self {
            Mem::B32 => 4,
            Mem::B64 => 8,
            Mem::S8 | Mem::U8 => 1,
        }
    }
}

/// Integer operations of the register's width (wrapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// The low half of `a * b`.
    Mul,
    /// Unsigned `a / b` (`b` is never 0: the builder divides by positive constants).
    DivU,
    /// Unsigned `a % b`.
    RemU,
    /// The signed smaller.
    MinS,
    /// The signed larger.
    MaxS,
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
    /// `a << b` (`b` below the width).
    Shl,
    /// Arithmetic `a >> b`.
    ShrS,
    /// Logical `a >> b`.
    ShrU,
}

/// One-operand integer operations (signed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IUn {
    /// `-a`, wrapping.
    Neg,
    /// `|a|`, wrapping.
    Abs,
}

/// Float operations, rounded to nearest even.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`, correctly rounded.
    Div,
    /// PTX's `min`: the smaller, the other operand if one is NaN, `-0` below `+0`.
    Min,
    /// PTX's `max`: the larger, the other operand if one is NaN, `+0` above `-0`.
    Max,
}

/// One-operand float operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FUn {
    /// `-a`.
    Neg,
    /// `|a|`.
    Abs,
    /// Correctly rounded square root.
    Sqrt,
    /// Round to the nearest integer, ties to even.
    Rni,
    /// Round down.
    Rmi,
    /// Round up.
    Rpi,
}

/// Comparisons. Float ones are ordered (false if either is NaN) except `Neu` and `Nan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// `a == b`.
    Eq,
    /// `a != b`, ordered (integers: not equal).
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// Not equal, or either is NaN.
    Neu,
    /// Either is NaN.
    Nan,
}

/// How a comparison reads its registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpTy {
    /// As floats of the registers' type.
    Float,
    /// As signed integers.
    Signed,
    /// As unsigned integers.
    Unsigned,
}

/// Conversions between registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cvt {
    /// Unsigned 32-bit to 64-bit integer.
    U32ToU64,
    /// Signed 32-bit integer to the nearest float (of the destination's type).
    S32ToFloat,
    /// Float to signed 32-bit integer, truncated toward zero (saturating; NaN to 0).
    FloatToS32,
    /// Float to float of the destination's type (f32 to f64 exactly, f64 to f32 rounded to
    /// nearest).
    FloatToFloat,
    /// The low byte of a 32-bit integer, sign-extended.
    S8,
    /// The low byte of a 32-bit integer, zero-extended.
    U8,
    /// A generic address to a global one (the identity on the devices and here).
    ToGlobal,
}

/// An instruction. Register operands are listed destination first.
#[derive(Clone, Debug, PartialEq)]
pub enum Inst {
    /// `d = ` a special register.
    Sreg(Reg, Sreg),
    /// `d = ` kernel parameter `j` (a 64-bit address).
    Param(Reg, u32),
    /// `d = ` the address of the block's shared memory (a 64-bit address in that space).
    SharedBase(Reg),
    /// `d = ` these bits (a number of the register's type).
    Imm(Reg, u64),
    /// `d = a`, bit for bit (registers of one width).
    Mov(Reg, Reg),
    /// `d = cvt(a)`.
    Cvt(Cvt, Reg, Reg),
    /// `d = op a` on integers.
    IUn(IUn, Reg, Reg),
    /// `d = a op b` on integers of the registers' width.
    IBin(IOp, Reg, Reg, Reg),
    /// `d = a * b + c`, integers, low half.
    IMad(Reg, Reg, Reg, Reg),
    /// `d = op a` on floats.
    FUn(FUn, Reg, Reg),
    /// `d = a op b` on floats.
    FBin(FOp, Reg, Reg, Reg),
    /// `d = a * b + c`, floats, rounded once.
    Fma(Reg, Reg, Reg, Reg),
    /// Predicate `d = a cmp b`.
    Setp(CmpTy, Cmp, Reg, Reg, Reg),
    /// `d = p ? a : b`.
    Selp(Reg, Reg, Reg, Reg),
    /// `d = ` the element at address `a`.
    Ld(Space, Mem, Reg, Reg),
    /// Stores register `v` at address `a`: `St(space, mem, a, v)`.
    St(Space, Mem, Reg, Reg),
    /// Four 32-bit registers `d` = the 16 bytes at address `a` (16-byte aligned), bit for bit.
    Ld4(Space, [Reg; 4], Reg),
    /// Stores four 32-bit registers `v` at address `a` (16-byte aligned): `St4(space, a, v)`.
    St4(Space, Reg, [Reg; 4]),
    /// `d = ` the 32-bit register `a` of the lane `delta` above this one in its warp (its own
    /// `a` where that lane is past the warp's end). Every thread of the warp must execute it
    /// together (`shfl.sync.down` with a full member mask).
    ShflDown(Reg, Reg, u32),
    /// Starts copying `bytes` (4 or 16, aligned so) from global address `src` to shared
    /// address `dst`, of which only the first `fill` bytes (a 32-bit register: 0 or `bytes`)
    /// are read and the rest are zeros: `CpAsync { dst, src, bytes, fill }`. The copy lands
    /// by a later [`Inst::CpAsyncWait`] (`cp.async`, sm_80 and newer).
    CpAsync {
        /// Shared address written.
        dst: Reg,
        /// Global address read.
        src: Reg,
        /// Bytes copied.
        bytes: u32,
        /// Bytes read from `src`; the rest are zeros.
        fill: Reg,
    },
    /// Closes the thread's copies started since the last commit into a group.
    CpAsyncCommit,
    /// Waits until at most `n` of the thread's committed groups are unfinished (the newest
    /// ones); the others' bytes are then in shared memory, for this thread (a barrier after it
    /// shows them to the block).
    CpAsyncWait(u32),
    /// Where a label points.
    Label(Label),
    /// A jump, if the predicate (when given) is `true` (or `false`, with `false` here).
    Bra(Label, Option<(Reg, bool)>),
    /// Waits until every thread of the block gets here (`bar.sync 0`).
    Bar,
    /// The thread ends.
    Ret,
}

/// A kernel: its parameters (64-bit addresses), registers, shared memory, the threads per
/// block it is written for, and its instructions.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// Its entry's name in the module.
    pub name: String,
    /// Parameters, each a 64-bit address.
    pub params: u32,
    /// The type of each register.
    pub regs: Vec<RegTy>,
    /// Bytes of shared memory per block.
    pub shared: u32,
    /// Threads per block it must be launched with.
    pub block: u32,
    /// Blocks that should fit on one multiprocessor at once (0: no hint). `ptxas` bounds the
    /// registers by it (65,536 / (blocks x threads)) and otherwise may trade a few spills for
    /// occupancy.
    pub min_blocks: u32,
    /// Labels defined.
    pub labels: u32,
    /// The instructions.
    pub body: Vec<Inst>,
}

/// Builds a [`Kernel`]'s registers and instructions. Immediates are set once, at the
/// kernel's entry, so that one register serves every use wherever it is.
pub struct Builder {
    /// The kernel so far (its body without the immediates).
    pub k: Kernel,
    head: Vec<Inst>,
    imms: std::collections::HashMap<(u64, RegTy), Reg>,
}

impl Builder {
    /// An empty kernel named `name` of `params` address parameters, for `block` threads.
    pub fn new(name: String, params: u32, block: u32) -> Builder {
        Builder {
            k: Kernel {
                name,
                params,
                regs: Vec::new(),
                shared: 0,
                block,
                min_blocks: 0,
                labels: 0,
                body: Vec::new(),
            },
            head: Vec::new(),
            imms: std::collections::HashMap::new(),
        }
    }

    /// The kernel: the immediates, then the body.
    pub fn finish(mut self) -> Kernel {
        self.head.append(&mut self.k.body);
        self.k.body = self.head;
        self.k
    }

    /// A new register of type `ty`.
    pub fn reg(&mut self, ty: RegTy) -> Reg {
        self.k.regs.push(ty);
        Reg(self.k.regs.len() as u32 - 1)
    }

    /// The type of register `r`.
    pub fn ty(&self, r: Reg) -> RegTy {
        self.k.regs[r.0 as usize]
    }

    /// A new label (placed with [`Builder::place`]).
    pub fn label(&mut self) -> Label {
        self.k.labels += 1;
        Label(self.k.labels - 1)
    }

    /// Places label `l` here.
    pub fn place(&mut self, l: Label) {
        self.k.body.push(Inst::Label(l));
    }

    /// Appends `i`.
    pub fn push(&mut self, i: Inst) {
        self.k.body.push(i);
    }

    /// A register of `ty` holding `bits`, set at the kernel's entry (one per value).
    pub fn imm(&mut self, ty: RegTy, bits: u64) -> Reg {
        debug_assert!(ty != RegTy::Pred, "no immediate predicates");
        if let Some(&r) = self.imms.get(&(bits, ty)) {
            return r;
        }
        let r = self.reg(ty);
        self.head.push(Inst::Imm(r, bits));
        self.imms.insert((bits, ty), r);
        r
    }

    /// A new register `a op b` (integers of `a`'s width).
    pub fn ibin(&mut self, op: IOp, a: Reg, b: Reg) -> Reg {
        let d = self.reg(self.ty(a));
        self.push(Inst::IBin(op, d, a, b));
        d
    }

    /// A new register `op(a)` (a float operation).
    pub fn fun(&mut self, op: FUn, a: Reg) -> Reg {
        let d = self.reg(self.ty(a));
        self.push(Inst::FUn(op, d, a));
        d
    }

    /// A new register `a op b` (floats).
    pub fn fbin(&mut self, op: FOp, a: Reg, b: Reg) -> Reg {
        let d = self.reg(self.ty(a));
        self.push(Inst::FBin(op, d, a, b));
        d
    }

    /// A new predicate `a cmp b`.
    pub fn setp(&mut self, ty: CmpTy, cmp: Cmp, a: Reg, b: Reg) -> Reg {
        let d = self.reg(RegTy::Pred);
        self.push(Inst::Setp(ty, cmp, d, a, b));
        d
    }

    /// A new register `p ? a : b`.
    pub fn selp(&mut self, a: Reg, b: Reg, p: Reg) -> Reg {
        let d = self.reg(self.ty(a));
        self.push(Inst::Selp(d, a, b, p));
        d
    }

    /// A new register of `ty`, `cvt(a)`.
    pub fn cvt(&mut self, c: Cvt, ty: RegTy, a: Reg) -> Reg {
        let d = self.reg(ty);
        self.push(Inst::Cvt(c, d, a));
        d
    }

    /// A new register of `ty` loaded from `addr`.
    pub fn ld(&mut self, space: Space, mem: Mem, ty: RegTy, addr: Reg) -> Reg {
        let d = self.reg(ty);
        self.push(Inst::Ld(space, mem, d, addr));
        d
    }
}
