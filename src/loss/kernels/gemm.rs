//! Matrix products on CPU slices, through the `gemm` crate that candle-core's CPU matmul uses
//! (the same kernels, called with the same strides, so a product here gives candle's bits).
//!
//! The kernels need products of views that candle would first have to copy out — a block of
//! rows, a vocabulary tile of columns, a transpose — and products that add into an existing
//! buffer (the weight gradient summed over blocks): both are strides and a flag to `gemm`.

use crate::loss::kernels::float::KernelFloat;
use gemm::Parallelism;

/// A `rows × cols` view of `data`: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// `data` as a row-major `rows × cols` matrix.
    pub(crate) fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose (no copy).
    pub(crate) fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Columns `start..start + len`.
    pub(crate) fn columns(self, start: usize, len: usize) -> Self {
        assert!(start + len <= self.cols, "MatRef::columns out of range");
        Self {
            data: &self.data[(start * self.col_stride).min(self.data.len())..],
            cols: len,
            ..self
        }
    }

    /// Rows `start..start + len`.
    pub(crate) fn rows(self, start: usize, len: usize) -> Self {
        assert!(start + len <= self.rows, "MatRef::rows out of range");
        Self {
            data: &self.data[(start * self.row_stride).min(self.data.len())..],
            rows: len,
            ..self
        }
    }

    fn check(&self) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride;
            assert!(last < self.data.len(), "MatRef addresses past its slice");
        }
    }
}

/// A mutable `rows × cols` view, as [`MatRef`].
pub(crate) struct MatMut<'a, T> {
    data: &'a mut [T],
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a, T> MatMut<'a, T> {
    /// `data` as a row-major `rows × cols` matrix.
    pub(crate) fn row_major(data: &'a mut [T], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
        }
    }

    /// `rows × cols` of `data` whose rows start `row_stride` elements apart.
    pub(crate) fn with_row_stride(
        data: &'a mut [T],
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> Self {
        assert!(row_stride >= cols, "MatMut::with_row_stride: rows overlap");
        Self {
            data,
            rows,
            cols,
            row_stride,
        }
    }

    /// Rows `start..start + len`.
    pub(crate) fn rows(self, start: usize, len: usize) -> Self {
        assert!(start + len <= self.rows, "MatMut::rows out of range");
        let offset = (start * self.row_stride).min(self.data.len());
        Self {
            data: &mut self.data[offset..],
            rows: len,
            ..self
        }
    }
}

/// The parallelism candle's CPU matmul uses: rayon's threads when there are several.
fn parallelism() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        threads => Parallelism::Rayon(threads),
    }
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` when `accumulate`. f32 and f64.
pub(crate) fn matmul<T: KernelFloat + 'static>(
    dst: MatMut<'_, T>,
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    accumulate: bool,
) {
    let (m, n, k) = (lhs.rows, rhs.cols, lhs.cols);
    assert!(
        rhs.rows == k && dst.rows == m && dst.cols == n,
        "matmul: shapes {m}x{k} · {}x{n} into {}x{}",
        rhs.rows,
        dst.rows,
        dst.cols
    );
    lhs.check();
    rhs.check();
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        (m - 1) * dst.row_stride + n - 1 < dst.data.len(),
        "matmul: the destination addresses past its slice"
    );
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                dst.data[i * dst.row_stride..][..n].fill(T::ZERO);
            }
        }
        return;
    }
    // SAFETY: the asserts above keep every address the strides reach inside the three slices;
    // `dst` is borrowed mutably, so it aliases neither operand; T is f32 or f64 (KernelFloat),
    // which `gemm` supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            1,
            dst.row_stride as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            if accumulate { T::ONE } else { T::ZERO },
            T::ONE,
            false,
            false,
            false,
            parallelism(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// The same product as candle's matmul, bit for bit, including transposed operands.
    #[test]
    fn equals_candles_matmul() -> candle_core::Result<()> {
        let a = Tensor::randn(0f64, 1.0, (5, 7), &Device::Cpu)?;
        let b = Tensor::randn(0f64, 1.0, (6, 7), &Device::Cpu)?;
        let expected = a.matmul(&b.t()?)?.flatten_all()?.to_vec1::<f64>()?;
        let (av, bv) = (
            a.flatten_all()?.to_vec1::<f64>()?,
            b.flatten_all()?.to_vec1::<f64>()?,
        );
        let mut out = vec![0f64; 30];
        matmul(
            MatMut::row_major(&mut out, 5, 6),
            MatRef::row_major(&av, 5, 7),
            MatRef::row_major(&bv, 6, 7).t(),
            false,
        );
        assert_eq!(out, expected);
        // Accumulating a column tile: out[:, 2..5] += a · b[2..5]ᵀ.
        let mut tile = out.clone();
        let mut acc = vec![0f64; 15];
        matmul(
            MatMut::row_major(&mut acc, 5, 3),
            MatRef::row_major(&av, 5, 7),
            MatRef::row_major(&bv, 6, 7).rows(2, 3).t(),
            false,
        );
        matmul(
            MatMut::row_major(&mut acc, 5, 3),
            MatRef::row_major(&av, 5, 7),
            MatRef::row_major(&bv, 6, 7).t().columns(2, 3),
            true,
        );
        for i in 0..5 {
            for j in 0..3 {
                tile[i * 6 + 2 + j] *= 2.0;
                assert!((acc[i * 3 + j] - tile[i * 6 + 2 + j]).abs() < 1e-12);
            }
        }
        Ok(())
    }
}
