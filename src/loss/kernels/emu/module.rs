//! A CUDA C source compiled for the emulator: the source with `prelude.h` before it and
//! `runtime.h` after it, built by the system C++ compiler into a shared object at run time (as
//! NVRTC builds the same source on a GPU), loaded with `dlopen`, and the launch plans of
//! [`launch`](super::super::launch) run on it over host buffers.
//!
//! The kernel table is generated here from the kernel families the CUDA side loads
//! ([`KERNEL_FAMILIES`](super::super::launch::KERNEL_FAMILIES) × f32/f64), so a family missing
//! from the source fails to compile; each entry carries its parameter kinds, which every launch
//! checks against its plan's parameters (a check a GPU launch cannot make).

use super::super::launch::{FloatKind, Launch, Param};
use candle_core::{bail, Result};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The emulator's prelude: CUDA's built-ins as host C++.
const PRELUDE: &str = include_str!("prelude.h");
/// The emulator's launcher: fibers, barriers, shuffles, the kernel table's type.
const RUNTIME: &str = include_str!("runtime.h");

/// The order in which the emulator runs the threads of a block and the blocks of a grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThreadOrder {
    /// Thread 0 first, block 0 first.
    Forward,
    /// The last thread first, the last block first.
    Reverse,
    /// A seeded random order of the blocks, and of the threads, drawn again every round.
    Random(u64),
}

impl ThreadOrder {
    /// Forward, reverse, and random with two seeds.
    pub(crate) const SOME: [ThreadOrder; 4] = [
        ThreadOrder::Forward,
        ThreadOrder::Reverse,
        ThreadOrder::Random(1),
        ThreadOrder::Random(2),
    ];

    fn code_and_seed(self) -> (c_int, c_ulonglong) {
        match self {
            ThreadOrder::Forward => (0, 0),
            ThreadOrder::Reverse => (1, 0),
            ThreadOrder::Random(seed) => (2, seed),
        }
    }
}

/// A kernel's entry in the compiled table (`emu::Entry` in `prelude.h`).
#[repr(C)]
struct Entry {
    name: *const c_char,
    arity: c_int,
    kinds: [c_int; 32],
    invoke: *const c_void,
}

type LaunchFn = unsafe extern "C" fn(
    *const Entry,
    *const c_uint,
    *const c_uint,
    c_uint,
    *mut *mut c_void,
    c_int,
    c_int,
    c_ulonglong,
    *mut c_char,
    usize,
) -> c_int;

/// The parameter kinds of `prelude.h`'s `kind_of`.
const KIND_POINTER: c_int = 1;
const KIND_U32: c_int = 2;
const KIND_F32: c_int = 3;
const KIND_F64: c_int = 4;

/// A CUDA C source compiled for the emulator and loaded into this process.
pub(crate) struct EmuModule {
    handle: *mut c_void,
    launch: LaunchFn,
    entries: Vec<(String, *const Entry)>,
    /// The values of the source's macros asked for at compile time.
    defines: Vec<(String, i64)>,
}

// SAFETY: the module is immutable after loading; the launcher serialises launches with a mutex
// (one block's shared memory at a time), so any thread may launch.
unsafe impl Send for EmuModule {}
unsafe impl Sync for EmuModule {}

impl Drop for EmuModule {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and nothing of the module is used after this.
        unsafe { libc::dlclose(self.handle) };
    }
}

/// Rewrites each `__shared__` declaration of `source` into a static variable and a registration
/// of its bytes with the launcher, which fills them with NaN bytes before every block. On the
/// same line, so that `__LINE__` (which names barriers) is unchanged.
fn register_shared(source: &str) -> Result<String> {
    const KEYWORD: &str = "__shared__";
    let mut out = String::with_capacity(source.len() + 256);
    let mut rest = source;
    let mut count = 0;
    while let Some(at) = rest.find(KEYWORD) {
        let (before, after) = rest.split_at(at);
        if before.trim_end().ends_with("extern") {
            bail!("the CUDA emulator does not emulate dynamic shared memory (`extern __shared__`)");
        }
        let after = &after[KEYWORD.len()..];
        let Some(end) = after.find(';') else {
            bail!("the CUDA emulator found a `__shared__` declaration without `;`");
        };
        let declaration = &after[..end];
        let declarator = declaration.split('[').next().unwrap_or_default();
        let name = declarator
            .rsplit(|c: char| c.is_whitespace() || c == '*' || c == '&')
            .find(|s| !s.is_empty())
            .unwrap_or_default();
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
            bail!("the CUDA emulator cannot read the `__shared__` declaration `{declaration}`");
        }
        out.push_str(before);
        out.push_str(&format!(
            "static {declaration}; static emu::SharedMemory emu_shared_{count}(&{name}, sizeof({name}));"
        ));
        count += 1;
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The translation unit: the prelude, the kernel source, the launcher, the kernel table of
/// `kernels` and one constant per macro of `defines`.
fn translation_unit(kernels: &[String], defines: &[&str]) -> String {
    let mut unit =
        String::from("#include \"prelude.h\"\n#include \"kernels.cu\"\n#include \"runtime.h\"\n");
    unit.push_str("extern \"C\" const emu::Entry candle_bleu_emu_kernels[] = {\n");
    for name in kernels {
        unit.push_str(&format!("    EMU_KERNEL({name}),\n"));
    }
    unit.push_str("};\n");
    for define in defines {
        unit.push_str(&format!(
            "extern \"C\" const long long candle_bleu_emu_define_{define} = (long long)({define});\n"
        ));
    }
    unit
}

/// A fresh directory for one compile.
fn work_dir() -> Result<PathBuf> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "candle-bleu-emu-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The C++ compiler: `CXX`, or `c++`.
fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_string())
}

fn symbol(handle: *mut c_void, name: &str) -> Result<*mut c_void> {
    let c_name = CString::new(name).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    // SAFETY: a valid handle and a NUL-terminated name.
    let ptr = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
    if ptr.is_null() {
        bail!("the CUDA emulator's module has no symbol `{name}`");
    }
    Ok(ptr)
}

impl EmuModule {
    /// Compiles `source` (CUDA C) for the emulator with kernels `<family>_<f32|f64>` for every
    /// family of `families` and `<family>_<f16|bf16>` for every family of `sixteen_bit`, and
    /// reads the integer value of each macro of `defines`.
    pub(crate) fn compile(
        source: &str,
        (families, sixteen_bit): (&[&str], &[&str]),
        defines: &[&str],
    ) -> Result<Self> {
        let named = |families: &[&str], floats: &[FloatKind]| -> Vec<String> {
            families
                .iter()
                .flat_map(|family| {
                    floats
                        .iter()
                        .map(move |f| format!("{family}_{}", f.suffix()))
                })
                .collect()
        };
        let mut kernels = named(families, &FloatKind::ALL);
        kernels.extend(named(sixteen_bit, &FloatKind::SIXTEEN_BIT));
        let dir = work_dir()?;
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text);
        write("prelude.h", PRELUDE)?;
        write("runtime.h", RUNTIME)?;
        write("kernels.cu", &register_shared(source)?)?;
        write("unit.cpp", &translation_unit(&kernels, defines))?;
        let library = dir.join("libkernels.so");
        let output = Command::new(compiler())
            // -fno-gnu-unique: the static locals of templates (the __shared__ arrays) would
            // otherwise be bound process-wide, one copy for every module loaded (a mutant's too).
            .args([
                "-std=c++17",
                "-O1",
                "-fPIC",
                "-shared",
                "-fno-gnu-unique",
                "-o",
            ])
            .arg(&library)
            .arg(dir.join("unit.cpp"))
            .output()
            .map_err(|e| {
                candle_core::Error::Msg(format!(
                    "the CUDA emulator needs a C++ compiler (`{}`; set CXX): {e}",
                    compiler()
                ))
            })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let head: String = stderr.lines().take(40).collect::<Vec<_>>().join("\n");
            bail!(
                "the CUDA emulator's compile failed ({}):\n{head}",
                dir.display()
            );
        }
        let module = Self::load(&library, &kernels, defines);
        let _ = std::fs::remove_dir_all(&dir);
        module
    }

    fn load(library: &Path, kernels: &[String], defines: &[&str]) -> Result<Self> {
        let path = CString::new(library.as_os_str().as_encoded_bytes())
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        // SAFETY: a NUL-terminated path of the library just built.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a NUL-terminated message after a failed dlopen.
            let reason = unsafe { CStr::from_ptr(libc::dlerror()) }.to_string_lossy();
            bail!("the CUDA emulator could not load its module: {reason}");
        }
        let mut module = Self {
            handle,
            // SAFETY: `candle_bleu_emu_launch` has this signature in runtime.h.
            launch: unsafe {
                std::mem::transmute::<*mut c_void, LaunchFn>(symbol(
                    handle,
                    "candle_bleu_emu_launch",
                )?)
            },
            entries: Vec::with_capacity(kernels.len()),
            defines: Vec::with_capacity(defines.len()),
        };
        let table = symbol(handle, "candle_bleu_emu_kernels")? as *const Entry;
        for (i, name) in kernels.iter().enumerate() {
            // SAFETY: the table holds one entry per kernel, in this order (translation_unit).
            let entry = unsafe { table.add(i) };
            // SAFETY: each entry's name is a string literal of the module.
            let entry_name = unsafe { CStr::from_ptr((*entry).name) }.to_string_lossy();
            if entry_name != *name {
                bail!("the CUDA emulator's table names {entry_name} where {name} was asked for");
            }
            module.entries.push((name.clone(), entry));
        }
        for define in defines {
            let value = symbol(handle, &format!("candle_bleu_emu_define_{define}"))?;
            // SAFETY: the constant is a `long long` (translation_unit).
            module
                .defines
                .push((define.to_string(), unsafe { *(value as *const i64) }));
        }
        Ok(module)
    }

    /// The value of macro `name` in the compiled source (asked for at compile time).
    pub(crate) fn define(&self, name: &str) -> Option<i64> {
        self.defines
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }

    fn entry(&self, name: &str) -> Result<*const Entry> {
        match self.entries.iter().find(|(n, _)| n == name) {
            Some((_, entry)) => Ok(*entry),
            None => bail!("the CUDA emulator's module has no kernel `{name}`"),
        }
    }

    /// The parameter kinds of kernel `name` as compiled: 1 pointer, 2 u32, 3 f32, 4 f64.
    pub(crate) fn parameter_kinds(&self, name: &str) -> Result<Vec<i32>> {
        let entry = self.entry(name)?;
        // SAFETY: a valid entry of the loaded table.
        let (arity, kinds) = unsafe { ((*entry).arity, (*entry).kinds) };
        Ok(kinds[..arity as usize].to_vec())
    }

    /// The parameter kinds `launch` passes, in its order.
    pub(crate) fn plan_kinds<B>(launch: &Launch<B>) -> Vec<i32> {
        launch
            .params
            .iter()
            .map(|p| match p {
                Param::Buffer(_) => KIND_POINTER,
                Param::U32(_) => KIND_U32,
                Param::Float(_) => match launch.float.arithmetic() {
                    FloatKind::F64 => KIND_F64,
                    _ => KIND_F32,
                },
            })
            .collect()
    }

    /// Runs `launch` with host buffers (each `Param::Buffer` the address of its first element)
    /// in `order`, after checking its parameters against the compiled kernel's.
    ///
    /// # Safety
    /// Every buffer must be valid for the reads and writes the kernel makes at the plan's
    /// dimensions (the buffers of a GPU launch of the same plan, on the host).
    pub(crate) unsafe fn run(
        &self,
        launch: &Launch<*mut c_void>,
        order: ThreadOrder,
    ) -> Result<()> {
        let name = launch.kernel_name();
        let entry = self.entry(&name)?;
        let (expected, passed) = (self.parameter_kinds(&name)?, Self::plan_kinds(launch));
        if expected != passed {
            bail!("{name}: the plan passes parameters of kinds {passed:?}, the kernel takes {expected:?} (1 pointer, 2 u32, 3 f32, 4 f64)");
        }
        // Each parameter's value at a fixed address, 8 bytes each (CUDA's kernelParams).
        let mut values: Vec<[u8; 8]> = launch
            .params
            .iter()
            .map(|p| {
                let mut bytes = [0u8; 8];
                match p {
                    Param::Buffer(ptr) => bytes = (*ptr as usize as u64).to_ne_bytes(),
                    Param::U32(v) => bytes[..4].copy_from_slice(&v.to_ne_bytes()),
                    Param::Float(v) => match launch.float.arithmetic() {
                        FloatKind::F64 => bytes = v.to_ne_bytes(),
                        _ => bytes[..4].copy_from_slice(&(*v as f32).to_ne_bytes()),
                    },
                }
                bytes
            })
            .collect();
        let mut pointers: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        let dims = launch.dims;
        let grid = [dims.grid.0, dims.grid.1, dims.grid.2];
        let block = [dims.block.0, dims.block.1, dims.block.2];
        let (order, seed) = order.code_and_seed();
        let mut error = vec![0 as c_char; 8192];
        // One launch at a time in the process, whichever module: the fibers switch stacks on
        // this thread only, but the C++ side's globals are only guarded per module.
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let status = (self.launch)(
            entry,
            grid.as_ptr(),
            block.as_ptr(),
            dims.shared_mem_bytes,
            pointers.as_mut_ptr(),
            order,
            order,
            seed,
            error.as_mut_ptr(),
            error.len(),
        );
        if status != 0 {
            let message = CStr::from_ptr(error.as_ptr()).to_string_lossy();
            bail!("the CUDA emulator stopped {message}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::register_shared;

    #[test]
    fn shared_declarations_register_on_their_line() {
        let source =
            "__device__ void f() {\n  __shared__ float a[WARPS];\n  __shared__ double b;\n}\n";
        let rewritten = register_shared(source).unwrap();
        assert_eq!(rewritten.lines().count(), source.lines().count());
        assert!(rewritten.contains(
            "static  float a[WARPS]; static emu::SharedMemory emu_shared_0(&a, sizeof(a));"
        ));
        assert!(rewritten
            .contains("static  double b; static emu::SharedMemory emu_shared_1(&b, sizeof(b));"));
        let error = register_shared("extern __shared__ float dynamic[];").unwrap_err();
        assert!(
            error.to_string().contains("dynamic shared memory"),
            "{error}"
        );
    }
}
