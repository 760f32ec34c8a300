//! AdamW (Loshchilov & Hutter 2019) whose state can be saved and restored, so that an
//! interrupted run resumes with the same moments (candle-nn's `AdamW` keeps them private).

use anyhow::{bail, Context, Result};
use candle_core::{backprop::GradStore, Tensor, Var};
use std::collections::HashMap;
use std::path::Path;

/// AdamW's hyper-parameters (candle-nn's `ParamsAdamW` defaults, but `weight_decay` 0).
#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    /// Learning rate (set each step by the schedule).
    pub lr: f64,
    /// `β₁`.
    pub beta1: f64,
    /// `β₂`.
    pub beta2: f64,
    /// `ε`.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-9,
            weight_decay: 0.0,
        }
    }
}

/// AdamW over named variables.
pub struct AdamW {
    /// `(name, variable, first moment, second moment)`, sorted by name.
    vars: Vec<(String, Var, Tensor, Tensor)>,
    step: usize,
    /// The hyper-parameters; `lr` may change between steps.
    pub config: AdamWConfig,
}

impl AdamW {
    /// An optimizer over `vars` (name → variable) with zero moments.
    pub fn new(vars: &HashMap<String, Var>, config: AdamWConfig) -> Result<Self> {
        let mut named: Vec<(String, Var, Tensor, Tensor)> = vars
            .iter()
            .map(|(name, var)| {
                let zeros = var.as_tensor().zeros_like()?;
                Ok((name.clone(), var.clone(), zeros.clone(), zeros))
            })
            .collect::<Result<_>>()?;
        named.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self {
            vars: named,
            step: 0,
            config,
        })
    }

    /// Steps taken.
    pub fn steps(&self) -> usize {
        self.step
    }

    /// One update from `grads`; variables without a gradient are left alone.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step += 1;
        let c = self.config;
        let scale_m = 1.0 / (1.0 - c.beta1.powi(self.step as i32));
        let scale_v = 1.0 / (1.0 - c.beta2.powi(self.step as i32));
        for (_, var, m, v) in self.vars.iter_mut() {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            *m = ((&*m * c.beta1)? + (g * (1.0 - c.beta1))?)?;
            *v = ((&*v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let update = ((&*m * scale_m)? / ((&*v * scale_v)?.sqrt()? + c.eps)?)?;
            let decayed = (var.as_tensor() * (1.0 - c.lr * c.weight_decay))?;
            var.set(&(decayed - (update * c.lr)?)?)?;
        }
        Ok(())
    }

    /// `loss.backward()` then [`AdamW::step`].
    pub fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
        let grads = loss.backward()?;
        self.step(&grads)
    }

    /// Saves the moments and the step count (safetensors).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for (name, _, m, v) in &self.vars {
            tensors.insert(format!("m.{name}"), m.clone());
            tensors.insert(format!("v.{name}"), v.clone());
        }
        let device = self.vars.first().map(|v| v.1.device().clone());
        let device = device.unwrap_or(candle_core::Device::Cpu);
        tensors.insert("step".into(), Tensor::new(&[self.step as i64], &device)?);
        candle_core::safetensors::save(&tensors, path)
            .with_context(|| format!("saving the optimizer state to {}", path.display()))
    }

    /// Restores what [`AdamW::save`] wrote; every variable must be in the file.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let device = self.vars.first().map(|v| v.1.device().clone());
        let device = device.unwrap_or(candle_core::Device::Cpu);
        let tensors = candle_core::safetensors::load(path, &device)
            .with_context(|| format!("loading the optimizer state from {}", path.display()))?;
        for (name, var, m, v) in self.vars.iter_mut() {
            match (
                tensors.get(&format!("m.{name}")),
                tensors.get(&format!("v.{name}")),
            ) {
                (Some(saved_m), Some(saved_v)) if saved_m.dims() == var.dims() => {
                    *m = saved_m.clone();
                    *v = saved_v.clone();
                }
                _ => bail!(
                    "{} has no moments for `{name}` of shape {:?}",
                    path.display(),
                    var.dims()
                ),
            }
        }
        let Some(step) = tensors.get("step") else {
            bail!("{} has no step count", path.display());
        };
        self.step = step.to_vec1::<i64>()?[0] as usize;
        Ok(())
    }
}
