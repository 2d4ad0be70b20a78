//! `oxccl-kernels`: compile every oxccl kernel with NVRTC, without a GPU (for CI and packaging).
//!
//! ```text
//! oxccl-kernels --source FILE          write the generated CUDA C
//! oxccl-kernels --ptx FILE             compile for compute_80 and write the PTX (the embedded fallback)
//! oxccl-kernels --check-embedded       fail if the embedded PTX differs from a fresh compilation
//! oxccl-kernels --cubin sm_80,sm_90 --ptxas PATH
//!                                      compile cubins with NVRTC, and the PTX with `ptxas -v` for
//!                                      each architecture; fail on any error or register spill
//! ```

use oxccl_cuda::{kernels, nvrtc};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxccl-kernels: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The compute_80 PTX, compiled at most once per run (several flags need it).
fn ptx80(cache: &mut Option<Vec<u8>>) -> Result<&[u8], String> {
    if cache.is_none() {
        *cache = Some(nvrtc::compile("compute_80").map_err(|e| e.to_string())?.image);
    }
    Ok(cache.as_deref().unwrap())
}

fn run(args: &[String]) -> Result<(), String> {
    let mut it = args.iter();
    let mut ptx: Option<Vec<u8>> = None;
    let mut ptxas = "ptxas".to_string();
    let mut cubins: Vec<String> = Vec::new();
    let mut did = false;
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--source" => {
                std::fs::write(val()?, kernels::source()).map_err(|e| e.to_string())?;
                did = true;
            }
            "--ptx" => {
                let path = val()?;
                std::fs::write(path, ptx80(&mut ptx)?).map_err(|e| e.to_string())?;
                did = true;
            }
            "--check-embedded" => {
                let image = ptx80(&mut ptx)?;
                if image != kernels::EMBEDDED_PTX.as_bytes() {
                    return Err("cuda/kernels/oxccl_kernels.ptx is stale: regenerate it with \
                                `oxccl-kernels --ptx cuda/kernels/oxccl_kernels.ptx`"
                        .into());
                }
                println!("embedded PTX matches the source ({} bytes)", image.len());
                did = true;
            }
            "--cubin" => cubins = val()?.split(',').map(str::to_string).collect(),
            "--ptxas" => ptxas = val()?,
            "-h" | "--help" => {
                println!("see the doc comment of cuda/src/bin/oxccl-kernels.rs");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !cubins.is_empty() {
        let (maj, min) = nvrtc::version().map_err(|e| e.to_string())?;
        println!("NVRTC {maj}.{min}; {} kernels", kernels::kernel_names().len());
        let image = ptx80(&mut ptx)?;
        let dir = std::env::temp_dir().join(format!("oxccl-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let ptx_path = dir.join("oxccl_kernels.ptx");
        std::fs::write(&ptx_path, image).map_err(|e| e.to_string())?;
        for arch in &cubins {
            let c = nvrtc::compile(arch).map_err(|e| e.to_string())?;
            if !c.log.trim().is_empty() {
                return Err(format!("NVRTC warnings for {arch}:\n{}", c.log));
            }
            // ptxas -v: per-kernel registers and spills of the same code for this architecture
            let out = Command::new(&ptxas)
                .arg(format!("-arch={arch}"))
                .args(["-v", "-O3", "-o"])
                .arg(dir.join(format!("oxccl_kernels.{arch}.cubin")))
                .arg(&ptx_path)
                .output()
                .map_err(|e| format!("cannot run {ptxas}: {e}"))?;
            let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                return Err(format!("ptxas -arch={arch} failed:\n{log}"));
            }
            let mut max_regs = 0u32;
            let mut spills = Vec::new();
            let mut current = String::new();
            for line in log.lines() {
                if let Some(i) = line.find("Compiling entry function '") {
                    current = line[i + 26..].split('\'').next().unwrap_or("").to_string();
                }
                if line.contains("bytes spill stores") || line.contains("bytes spill loads") {
                    let nonzero = line
                        .split(',')
                        .filter(|p| p.contains("spill"))
                        .any(|p| p.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(1) != 0);
                    if nonzero {
                        spills.push(format!("{current}: {}", line.trim()));
                    }
                }
                if let Some(i) = line.find("Used ") {
                    let n = line[i + 5..].split_whitespace().next().and_then(|n| n.parse::<u32>().ok()).unwrap_or(0);
                    max_regs = max_regs.max(n);
                }
            }
            let entries = log.matches("Compiling entry function").count();
            if entries != kernels::kernel_names().len() {
                return Err(format!(
                    "ptxas compiled {entries} entry functions, expected {}",
                    kernels::kernel_names().len()
                ));
            }
            if !spills.is_empty() {
                return Err(format!("register spills for {arch}:\n{}", spills.join("\n")));
            }
            println!(
                "{arch}: NVRTC cubin {} bytes; ptxas: {entries} kernels, no spills, at most {max_regs} registers",
                c.image.len()
            );
        }
        did = true;
    }
    if !did {
        return Err("nothing to do (try --help)".into());
    }
    Ok(())
}
