/**
 * @toolgate/client: the TypeScript client of the toolgate sidecar.
 *
 *   const client = new ToolgateClient({ identity: devIdentity({ tenant: 'acme' }) });
 *   const result = await client.execute('echo', { text: 'hi' });
 *
 * Adapters: `@toolgate/client/ai` (Vercel AI SDK tools) and `@toolgate/client/langchain`.
 */
export {
  DEFAULT_ADDRESS,
  DEFAULT_MAX_PAGES,
  DEFAULT_TIMEOUT_MS,
  PageLimitError,
  ToolgateClient,
  type CallSettings,
  type ClientOptions,
  type ExecuteManySettings,
  type ExecuteSettings,
  type ListApprovalsSettings,
} from './client.js';
export {
  CancelledError,
  DeadlineExceededError,
  FailedPreconditionError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
  ToolCallError,
  ToolgateError,
  TransportError,
  UnauthenticatedError,
  UnavailableError,
  raiseForStatus,
  type GrpcCode,
} from './errors.js';
export { bearerToken, devIdentity, tokenProvider, type DevIdentityFields, type Identity, type TokenProviderOptions } from './identity.js';
export type {
  Approval,
  ApprovalDecision,
  ApprovalPage,
  ApprovalState,
  RiskLevel,
  ToolCall,
  ToolDefinition,
  ToolList,
  ToolResult,
  ToolStatus,
} from './models.js';
export type { RetryPolicy } from './retry.js';
