//! The bounded FIFO of engine requests waiting for the MLX thread.

use std::collections::VecDeque;

use protocol::RequestId;

use crate::executor::Job;

/// Jobs waiting to run, oldest first; at most `capacity` of them.
pub struct JobQueue {
    waiting: VecDeque<Job>,
    capacity: usize,
}

impl JobQueue {
    /// An empty queue holding at most `capacity` jobs.
    pub fn new(capacity: usize) -> Self {
        JobQueue {
            waiting: VecDeque::new(),
            capacity,
        }
    }

    /// Appends a job, or gives it back when the queue is full.
    pub fn push(&mut self, job: Job) -> Result<(), Job> {
        if self.waiting.len() >= self.capacity {
            return Err(job);
        }
        self.waiting.push_back(job);
        Ok(())
    }

    /// The oldest job.
    pub fn pop(&mut self) -> Option<Job> {
        self.waiting.pop_front()
    }

    /// Whether the oldest job is a `generate`.
    pub fn front_is_generate(&self) -> bool {
        matches!(
            self.waiting.front().map(|j| &j.work),
            Some(crate::executor::Work::Generate(_))
        )
    }

    /// Takes out the job with this id (the first one, should a host reuse ids).
    pub fn remove(&mut self, id: &RequestId) -> Option<Job> {
        let at = self.waiting.iter().position(|job| &job.id == id)?;
        self.waiting.remove(at)
    }

    /// Takes out every job, oldest first.
    pub fn drain(&mut self) -> Vec<Job> {
        self.waiting.drain(..).collect()
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether no job waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::Work;

    fn job(id: i64) -> Job {
        Job {
            id: id.into(),
            work: Work::Reset { prompt_cache: true },
            cancel: mlx_engine::CancelToken::new(),
        }
    }

    #[test]
    fn bounded_fifo_with_removal_by_id() {
        let mut q = JobQueue::new(2);
        assert!(q.push(job(1)).is_ok());
        assert!(q.push(job(2)).is_ok());
        assert_eq!(q.push(job(3)).unwrap_err().id, 3.into());
        assert_eq!(q.remove(&2.into()).unwrap().id, 2.into());
        assert!(q.remove(&2.into()).is_none());
        assert!(q.push(job(4)).is_ok());
        assert_eq!(q.pop().unwrap().id, 1.into());
        assert_eq!(q.len(), 1);
        assert_eq!(q.drain().len(), 1);
        assert!(q.is_empty());
    }
}
