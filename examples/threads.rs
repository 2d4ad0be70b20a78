//! Threads as ranks: `cargo run --release --example threads`.
use oxccl::{Communicator, ReduceOp};

fn main() -> oxccl::Result<()> {
    let n = 4;
    let comms = Communicator::init_all(n)?;
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || -> oxccl::Result<()> {
                let mut v: Vec<f32> = (0..8).map(|i| (c.rank() * 100 + i) as f32).collect();
                c.all_reduce_inplace(&mut v, ReduceOp::Sum)?;
                let mut gathered = vec![0u32; n];
                c.all_gather(&[c.rank() as u32], &mut gathered)?;
                if c.rank() == 0 {
                    println!("allreduce: {v:?}\nallgather: {gathered:?}");
                }
                Ok(())
            });
        }
    });
    Ok(())
}
