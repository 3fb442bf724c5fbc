/* libibverbs 1.0's objects, as a program built against libibverbs 1.0's <infiniband/verbs.h>
 * (2006) saw them, named with a _1_0 suffix beside today's. What kept its shape since (the
 * completion, the SGE, the device attributes, the async event) is today's, from
 * <infiniband/verbs.h>; what grew at its end since (struct ibv_qp_attr, which ended before
 * today's rate_limit; struct ibv_port_attr) is today's cut short where 1.0's ended.
 * tests/layout.rs checks softroce's structures (verbs_1_0/abi.rs) against these. */
#include <pthread.h>
#include <infiniband/verbs.h>

struct ibv_context_1_0;
struct ibv_cq_1_0;
struct ibv_srq_1_0;
struct ibv_qp_1_0;
struct ibv_ah_1_0;
struct ibv_send_wr_1_0;
struct ibv_recv_wr_1_0;

struct ibv_device_1_0 {
    void *obsolete_sysfs_dev;
    void *obsolete_sysfs_ibdev;
    struct ibv_device *real_device;
    struct _ibv_device_ops _ops;
};

struct ibv_context_ops_1_0 {
    void *query_device, *query_port, *alloc_pd, *dealloc_pd, *reg_mr, *dereg_mr, *create_cq;
    int (*poll_cq)(struct ibv_cq_1_0 *cq, int num_entries, struct ibv_wc *wc);
    int (*req_notify_cq)(struct ibv_cq_1_0 *cq, int solicited_only);
    void *cq_event, *resize_cq, *destroy_cq, *create_srq, *modify_srq, *query_srq,
        *destroy_srq;
    int (*post_srq_recv)(struct ibv_srq_1_0 *srq, struct ibv_recv_wr_1_0 *wr,
                         struct ibv_recv_wr_1_0 **bad_wr);
    void *create_qp, *query_qp, *modify_qp, *destroy_qp;
    int (*post_send)(struct ibv_qp_1_0 *qp, struct ibv_send_wr_1_0 *wr,
                     struct ibv_send_wr_1_0 **bad_wr);
    int (*post_recv)(struct ibv_qp_1_0 *qp, struct ibv_recv_wr_1_0 *wr,
                     struct ibv_recv_wr_1_0 **bad_wr);
    void *create_ah, *destroy_ah, *attach_mcast, *detach_mcast;
};

struct ibv_comp_channel_1_0 {
    int fd;
};

struct ibv_context_1_0 {
    struct ibv_device_1_0 *device;
    struct ibv_context_ops_1_0 ops;
    int cmd_fd;
    int async_fd;
    int num_comp_vectors;
    struct ibv_context *real_context;
};

struct ibv_pd_1_0 {
    struct ibv_context_1_0 *context;
    uint32_t handle;
    struct ibv_pd *real_pd;
};

struct ibv_mr_1_0 {
    struct ibv_context_1_0 *context;
    struct ibv_pd_1_0 *pd;
    uint32_t handle;
    uint32_t lkey;
    uint32_t rkey;
    struct ibv_mr *real_mr;
};

struct ibv_srq_1_0 {
    struct ibv_context_1_0 *context;
    void *srq_context;
    struct ibv_pd_1_0 *pd;
    uint32_t handle;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    uint32_t events_completed;
    struct ibv_srq *real_srq;
};

struct ibv_qp_init_attr_1_0 {
    void *qp_context;
    struct ibv_cq_1_0 *send_cq;
    struct ibv_cq_1_0 *recv_cq;
    struct ibv_srq_1_0 *srq;
    struct ibv_qp_cap cap;
    enum ibv_qp_type qp_type;
    int sq_sig_all;
};

struct ibv_send_wr_1_0 {
    struct ibv_send_wr_1_0 *next;
    uint64_t wr_id;
    struct ibv_sge *sg_list;
    int num_sge;
    enum ibv_wr_opcode opcode;
    int send_flags;
    uint32_t imm_data;
    union {
        struct {
            uint64_t remote_addr;
            uint32_t rkey;
        } rdma;
        struct {
            uint64_t remote_addr;
            uint64_t compare_add;
            uint64_t swap;
            uint32_t rkey;
        } atomic;
        struct {
            struct ibv_ah_1_0 *ah;
            uint32_t remote_qpn;
            uint32_t remote_qkey;
        } ud;
    } wr;
};

struct ibv_recv_wr_1_0 {
    struct ibv_recv_wr_1_0 *next;
    uint64_t wr_id;
    struct ibv_sge *sg_list;
    int num_sge;
};

struct ibv_qp_1_0 {
    struct ibv_context_1_0 *context;
    void *qp_context;
    struct ibv_pd_1_0 *pd;
    struct ibv_cq_1_0 *send_cq;
    struct ibv_cq_1_0 *recv_cq;
    struct ibv_srq_1_0 *srq;
    uint32_t handle;
    uint32_t qp_num;
    enum ibv_qp_state state;
    enum ibv_qp_type qp_type;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    uint32_t events_completed;
    struct ibv_qp *real_qp;
};

struct ibv_cq_1_0 {
    struct ibv_context_1_0 *context;
    void *cq_context;
    uint32_t handle;
    int cqe;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    uint32_t comp_events_completed;
    uint32_t async_events_completed;
    struct ibv_cq *real_cq;
};

struct ibv_ah_1_0 {
    struct ibv_context_1_0 *context;
    struct ibv_pd_1_0 *pd;
    uint32_t handle;
    struct ibv_ah *real_ah;
};
