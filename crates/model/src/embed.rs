//! Embeddings from a generative model, as llama.cpp computes them (`llama-embedding`,
//! llama-server's `/v1/embeddings`): the final hidden state of each token after the
//! output norm (llama.cpp's `result_norm`, `[n_tokens, n_embd]`), pooled over the input,
//! then scaled to unit Euclidean length (llama-server's default `embd_normalize = 2`).

use crate::Model;

/// How a sequence's hidden states become one vector (llama.cpp's `llama_pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the tokens.
    Mean,
    /// The first token's (a BERT-style `[CLS]`; for a decoder, the BOS token's).
    Cls,
    /// The last token's (it has seen the whole input: what decoder embedding models use).
    Last,
}

impl Pooling {
    /// `mean`, `cls` or `last`.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// The file's `{arch}.pooling_type` (1 mean, 2 cls, 3 last), when it names one of these.
    pub fn of_model(model: &Model) -> Option<Pooling> {
        let key = format!("{}.pooling_type", model.config.arch.name());
        match model.file.get(&key).and_then(|v| v.as_int()) {
            Some(1) => Some(Pooling::Mean),
            Some(2) => Some(Pooling::Cls),
            Some(3) => Some(Pooling::Last),
            _ => None,
        }
    }

    /// Pool `hidden` (`[n, n_embd]`, n ≥ 1) into `[n_embd]`; the mean is summed in f64.
    pub fn pool(self, hidden: &[f32], n_embd: usize) -> Vec<f32> {
        let n = hidden.len() / n_embd.max(1);
        match self {
            Pooling::Cls => hidden[..n_embd].to_vec(),
            Pooling::Last => hidden[(n - 1) * n_embd..n * n_embd].to_vec(),
            Pooling::Mean => {
                let mut sum = vec![0f64; n_embd];
                for row in hidden.chunks_exact(n_embd) {
                    for (s, &x) in sum.iter_mut().zip(row) {
                        *s += x as f64;
                    }
                }
                sum.into_iter().map(|s| (s / n as f64) as f32).collect()
            }
        }
    }
}

/// `v` scaled to unit Euclidean length (left as it is when it is all zeros).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in v {
            *x = (*x as f64 / norm) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_picks_rows_and_means() {
        let h = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0];
        assert_eq!(Pooling::Cls.pool(&h, 2), vec![1.0, 2.0]);
        assert_eq!(Pooling::Last.pool(&h, 2), vec![5.0, 9.0]);
        assert_eq!(Pooling::Mean.pool(&h, 2), vec![3.0, 5.0]);
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0; 3];
        normalize(&mut z);
        assert_eq!(z, vec![0.0; 3]);
    }
}
