//! One rank of a job started by a launcher:
//! `torchrun --nproc-per-node 2 --no-python target/release/examples/launcher_env`, or
//! `mpirun -np 2 ...`, or by hand with `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` set.
use oxccl::{Communicator, ReduceOp};

fn main() -> oxccl::Result<()> {
    let comm = Communicator::from_env()?;
    let mut x = vec![comm.rank() as f64 + 1.0; 4];
    comm.all_reduce_inplace(&mut x, ReduceOp::Avg)?;
    println!("rank {} of {}: avg = {:?}", comm.rank(), comm.size(), x);
    Ok(())
}
