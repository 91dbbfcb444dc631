from paged_infer.block_manager import BlockManager
from paged_infer.scheduler import Scheduler, SchedulerConfig, SequenceGroup
from paged_infer.sequence import Sequence
from paged_infer.sampling_params import SamplingParams

def setup():
    bm = BlockManager(num_gpu_blocks=5, block_size=4, num_cpu_blocks=0, watermark=0)
    sch = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=64), bm)
    a = SequenceGroup('A', [Sequence([1]*5, SamplingParams(max_tokens=20))], SamplingParams(max_tokens=20), arrival_time=0)
    b = SequenceGroup('B', [Sequence([2]*8, SamplingParams(max_tokens=20))], SamplingParams(max_tokens=20), arrival_time=1)
    for g in (a, b): sch.add(g)
    out = sch.schedule(1)  # admit both prompts
    for s in out.seqs: s.num_computed_tokens = s.num_tokens; s.append_token(9)
    return bm, sch, a, b

for K in (1, 4):
    bm, sch, a, b = setup()
    print('before: free', bm.num_free_blocks, 'A', a.seqs[0].num_tokens, bm.tables[a.seqs[0].seq_id].num_tokens, 'B', b.seqs[0].num_tokens, bm.tables[b.seqs[0].seq_id].num_tokens)
    out = sch.schedule(K)
    print(f'K={K}: ran', [s.request_id for s in out.seqs], 'preempted', out.preempted, 'num_steps', out.num_steps)
