//! Getting started (README): one all-reduce across the ranks a launcher started.
use oxccl::{Communicator, ReduceOp};

fn main() -> oxccl::Result<()> {
    let comm = Communicator::from_env()?; // torchrun, mpirun, srun, or RANK/WORLD_SIZE/MASTER_ADDR
    let mut grads = vec![comm.rank() as f32 + 1.0; 4];
    comm.all_reduce_inplace(&mut grads, ReduceOp::Sum)?;
    println!("rank {} of {}: {grads:?}", comm.rank(), comm.size());
    Ok(())
}
