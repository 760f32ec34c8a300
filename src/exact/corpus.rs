//! The one check of a corpus' shape, shared by BLEU and chrF: hypotheses and reference lists
//! in parallel, a reference for every segment, and (for a score) at least one segment; and the
//! one check of a sentence's references.

use super::config::{invalid, MetricError};

/// Whether a corpus with no segment is an error, and what the reference implementations do
/// with one (for the message).
#[derive(Debug, Clone, Copy)]
pub(crate) enum EmptyCorpus {
    /// Allowed: the per-segment statistics of no segment are empty.
    Allowed,
    /// An error: a score needs a segment. The text says what sacrebleu (and NLTK) raise.
    Refused(&'static str),
}

/// Checks that `refs` holds one list of references per hypothesis (`hyps` of them), that no
/// list is empty, and, under [`EmptyCorpus::Refused`], that there is a segment; in this order.
pub(crate) fn check_corpus<R>(
    hyps: usize,
    refs: &[Vec<R>],
    empty: EmptyCorpus,
) -> Result<(), MetricError> {
    if hyps != refs.len() {
        return Err(invalid(
            "refs",
            format!(
                "must have one entry (a list of references) per hypothesis: {} hypotheses, {} \
                 reference lists",
                hyps,
                refs.len()
            ),
        ));
    }
    if let Some(i) = refs.iter().position(|r| r.is_empty()) {
        return Err(invalid(
            "refs",
            format!("segment {i} has no reference (refs[{i}] is empty)"),
        ));
    }
    if let (0, EmptyCorpus::Refused(raises)) = (hyps, empty) {
        return Err(invalid("hyps", format!("the corpus is empty ({raises})")));
    }
    Ok(())
}

/// Checks that a sentence has a reference (`refs` references).
pub(crate) fn check_sentence(refs: usize) -> Result<(), MetricError> {
    if refs == 0 {
        return Err(invalid(
            "refs",
            "the sentence has no reference (refs is empty)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argument(result: Result<(), MetricError>) -> Option<&'static str> {
        result
            .err()
            .map(|MetricError::InvalidArgument { argument, .. }| argument)
    }

    #[test]
    fn shapes_are_checked_in_order() {
        let refused = EmptyCorpus::Refused("sacrebleu raises IndexError");
        let one = [vec!["a"]];
        assert_eq!(argument(check_corpus(1, &one, refused)), None);
        assert_eq!(argument(check_corpus(0, &one, refused)), Some("refs"));
        assert_eq!(
            argument(check_corpus(1, &[Vec::<&str>::new()], refused)),
            Some("refs")
        );
        assert_eq!(
            argument(check_corpus::<&str>(0, &[], refused)),
            Some("hyps")
        );
        assert_eq!(
            argument(check_corpus::<&str>(0, &[], EmptyCorpus::Allowed)),
            None
        );
        let message = check_corpus::<&str>(0, &[], refused)
            .unwrap_err()
            .to_string();
        assert!(message.contains("the corpus is empty (sacrebleu raises IndexError)"));
        assert_eq!(argument(check_sentence(0)), Some("refs"));
        assert_eq!(argument(check_sentence(2)), None);
    }
}
