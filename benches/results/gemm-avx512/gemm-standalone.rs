use std::time::Instant;
fn main() {
    let (m, k, n) = (2048usize, 512usize, 32000usize);
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) * 0.01).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) * 0.01).collect();
    let mut c = vec![0f32; m * n];
    let mut times = vec![];
    for _ in 0..7 {
        let t = Instant::now();
        unsafe {
            gemm::gemm(m, n, k, c.as_mut_ptr(), 1, n as isize, false, a.as_ptr(), 1, k as isize,
                b.as_ptr(), 1, n as isize, 0.0f32, 1.0f32, false, false, false, gemm::Parallelism::Rayon(2));
        }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("median {:.1} ms  ({:.1} GFLOP/s) c0={}", times[3], 2.0 * (m * k * n) as f64 / times[3] / 1e6, c[12345]);
}
