// The MTP block's suite (tests/mtp_draft_suite.h) on the CPU backend.
#include "mtp_draft_suite.h"

namespace mtp_draft_suite {

INSTANTIATE_TEST_SUITE_P(Cpu, MtpDraft, ::testing::Values(Device::CPU),
                         [](const ::testing::TestParamInfo<Device>& i) { return std::string(device_name(i.param)); });

}  // namespace mtp_draft_suite
